/* An LD_PRELOAD shim that fails exactly one allocation, to check that a
 * program (libdist linked in statically) survives each of its allocations
 * failing in turn.
 *
 *   FAIL_ALLOC_AT=k     the k-th malloc, calloc, realloc or strdup (counted
 *                       together, from 1) returns NULL
 *   FAIL_ALLOC_COUNT=1  prints "failalloc: N allocations" to stderr at exit
 *
 * Only calls made from the program's own executable image count, and only
 * those can fail: gRPC and libc allocate for themselves too, and gRPC
 * aborts by design when its own allocation fails, so failing those would
 * test nothing of the program's. The image is the main program's
 * executable segments, found once through dl_iterate_phdr.
 *
 * Under ASan it stands in front of ASan's allocator when ASan is told not
 * to insist on coming first (ASAN_OPTIONS=verify_asan_link_order=0), and
 * LeakSanitizer then checks each failure path for leaks at exit. */
#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void *(*malloc_fn)(size_t);
typedef void *(*calloc_fn)(size_t, size_t);
typedef void *(*realloc_fn)(void *, size_t);
typedef char *(*strdup_fn)(const char *);
typedef void (*free_fn)(void *);

static malloc_fn next_malloc;
static calloc_fn next_calloc;
static realloc_fn next_realloc;
static strdup_fn next_strdup;
static free_fn next_free;

static long fail_at;   /* 0: fail nothing */
static int report;     /* FAIL_ALLOC_COUNT set */
static atomic_long counted;
static uintptr_t image_lo, image_hi; /* the executable's code */
static int resolving; /* in dlsym: before main, one thread only */

/* dlsym may allocate before the real allocators are known: those calls
 * are served from here (static, so zeroed), and free() ignores them. */
static _Alignas(16) char early[8192];
static size_t early_used;

static void *early_alloc(size_t n) {
  size_t at = (early_used + 15) & ~(size_t)15;
  if (at + n > sizeof early) return NULL;
  early_used = at + n;
  return early + at;
}

static int find_image(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size, (void)arg;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
    if (!image_lo || lo < image_lo) image_lo = lo;
    if (hi > image_hi) image_hi = hi;
  }
  return 1; /* the first object listed is the main program */
}

/* 1 once the next allocator is known. Under ASan the shim stands in front
 * of ASan's allocator (ASAN_OPTIONS=verify_asan_link_order=0), whose own
 * start-up allocates inside dlsym, where dlsym cannot answer yet: those
 * allocations are served from early[] too. */
static int ready(void) {
  if (next_free) return 1;
  resolving = 1;
  next_malloc = (malloc_fn)dlsym(RTLD_NEXT, "malloc");
  next_calloc = (calloc_fn)dlsym(RTLD_NEXT, "calloc");
  next_realloc = (realloc_fn)dlsym(RTLD_NEXT, "realloc");
  next_strdup = (strdup_fn)dlsym(RTLD_NEXT, "strdup");
  free_fn f = (free_fn)dlsym(RTLD_NEXT, "free");
  resolving = 0;
  if (next_malloc && next_calloc && next_realloc && next_strdup) next_free = f;
  return next_free != NULL;
}

static int is_early(const void *p) {
  return (const char *)p >= early && (const char *)p < early + sizeof early;
}

static void print_count(void) {
  fprintf(stderr, "failalloc: %ld allocations\n", atomic_load(&counted));
}

__attribute__((constructor)) static void failalloc_init(void) {
  dl_iterate_phdr(find_image, NULL);
  const char *at = getenv("FAIL_ALLOC_AT"), *count = getenv("FAIL_ALLOC_COUNT");
  fail_at = at ? atol(at) : 0;
  report = count && strcmp(count, "1") == 0;
  if (report) atexit(print_count);
}

/* 1 when this call, made from caller, is the one to fail. */
static int fail_this(const void *caller) {
  uintptr_t pc = (uintptr_t)caller;
  if (pc < image_lo || pc >= image_hi) return 0;
  long k = atomic_fetch_add(&counted, 1) + 1;
  return fail_at > 0 && k == fail_at;
}

void *malloc(size_t n) {
  if (resolving || !ready()) return early_alloc(n);
  if (fail_this(__builtin_return_address(0))) return NULL;
  return next_malloc(n);
}

void *calloc(size_t n, size_t size) {
  if (resolving || !ready()) return early_alloc(n * size);
  if (fail_this(__builtin_return_address(0))) return NULL;
  return next_calloc(n, size);
}

void *realloc(void *p, size_t n) {
  if (resolving || !ready() || is_early(p)) {
    /* an early block's size is not kept: copy what can lie after it */
    void *q = resolving || !ready() ? early_alloc(n) : next_malloc(n);
    size_t room = p ? (size_t)(early + sizeof early - (char *)p) : 0;
    if (q && p) memcpy(q, p, n < room ? n : room);
    return q;
  }
  if (fail_this(__builtin_return_address(0))) return NULL;
  return next_realloc(p, n);
}

char *strdup(const char *s) {
  if (resolving || !ready()) {
    char *d = early_alloc(strlen(s) + 1);
    return d ? strcpy(d, s) : NULL;
  }
  if (fail_this(__builtin_return_address(0))) return NULL;
  return next_strdup(s);
}

void free(void *p) {
  if (!p || is_early(p)) return;
  if (ready()) next_free(p);
}
