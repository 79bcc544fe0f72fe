/* An LD_PRELOAD shim that fails exactly one allocation, to check that a
 * program (libdist or distd's code linked in statically) survives each of
 * its allocations failing in turn.
 *
 *   FAIL_ALLOC_AT=k     the k-th malloc, calloc, realloc or strdup (counted
 *                       together, from 1) returns NULL
 *                       and says so on stderr ("failalloc: allocation k
 *                       fails")
 *   FAIL_ALLOC_SIZE=n   the first allocation of exactly n bytes counted
 *                       (calloc: count times size) returns NULL, whatever
 *                       its k: a test's way to fail one site every run
 *                       (the daemon's k moves with its own threads)
 *   FAIL_ALLOC_SIZE_NTH=j
 *                       with FAIL_ALLOC_SIZE: the j-th of that size fails
 *                       instead (a request's bytes come before the piece
 *                       made of them)
 *   FAIL_ALLOC_COUNT=1  prints "failalloc: N allocations" to stderr at exit
 *   FAIL_ALLOC_ARMED_BY_SIGUSR2=1
 *                       counts nothing until the process receives SIGUSR2:
 *                       a daemon allocates a lot while it starts, from
 *                       several threads, and the sweep is of the
 *                       allocations made while it serves requests (the
 *                       program must not take SIGUSR2 for itself; distd
 *                       does not)
 *
 * Only calls made from the program's own executable image, or from
 * jansson's, count, and only those can fail: gRPC and libc allocate for
 * themselves too, and gRPC aborts by design when its own allocation fails,
 * so failing those would test nothing of the program's. jansson's are
 * made for the program's own calls and answered by a NULL the program
 * must handle (protobuf-c's go through the program's allocator, so they
 * count already). The images are the executable segments of the main
 * program and of libjansson, found once through dl_iterate_phdr.
 *
 * Under ASan it stands in front of ASan's allocator when ASan is told not
 * to insist on coming first (ASAN_OPTIONS=verify_asan_link_order=0), and
 * LeakSanitizer then checks each failure path for leaks at exit. */
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
static size_t fail_size; /* 0: none */
static long fail_size_nth = 1;
static atomic_long sized; /* allocations of fail_size bytes counted */
static int report;     /* FAIL_ALLOC_COUNT set */
static atomic_long counted;
static atomic_int armed; /* allocations count (and may fail) once set */
/* The code whose calls count: the executable's, then jansson's. */
typedef struct code_range {
  uintptr_t lo, hi;
} code_range;
static code_range images[2];
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

/* The span of an object's executable segments, into *r. */
static void note_code(const struct dl_phdr_info *info, code_range *r) {
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
    if (!r->lo || lo < r->lo) r->lo = lo;
    if (hi > r->hi) r->hi = hi;
  }
}

static int find_images(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  int *seen = arg;
  if ((*seen)++ == 0) note_code(info, &images[0]); /* listed first: the main program */
  else if (info->dlpi_name && strstr(info->dlpi_name, "/libjansson.so"))
    note_code(info, &images[1]);
  return 0;
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

/* A signal handler may only do what is async-signal-safe: set the flag. */
static void arm(int sig) {
  (void)sig;
  atomic_store(&armed, 1);
}

static int env_is_1(const char *name) {
  const char *v = getenv(name);
  return v && strcmp(v, "1") == 0;
}

__attribute__((constructor)) static void failalloc_init(void) {
  int seen = 0;
  dl_iterate_phdr(find_images, &seen);
  const char *at = getenv("FAIL_ALLOC_AT");
  fail_at = at ? atol(at) : 0;
  const char *size = getenv("FAIL_ALLOC_SIZE");
  fail_size = size ? (size_t)atoll(size) : 0;
  const char *nth = getenv("FAIL_ALLOC_SIZE_NTH");
  if (nth) fail_size_nth = atol(nth);
  report = env_is_1("FAIL_ALLOC_COUNT");
  if (report) atexit(print_count);
  if (!env_is_1("FAIL_ALLOC_ARMED_BY_SIGUSR2")) {
    atomic_store(&armed, 1);
    return;
  }
  struct sigaction sa = {.sa_handler = arm, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR2, &sa, NULL);
}

/* "failalloc: allocation k fails" on stderr, so that a sweep can tell a
 * run that reached the failure from one that ended first. Written with
 * write(2) and formatted by hand: stdio may allocate, here of all places. */
static void note_failure(long k) {
  char line[64] = "failalloc: allocation ", digits[24];
  size_t len = strlen(line), n = 0;
  do digits[n++] = (char)('0' + k % 10); while ((k /= 10) > 0);
  while (n > 0) line[len++] = digits[--n];
  memcpy(line + len, " fails\n", 7);
  ssize_t ignored = write(2, line, len + 7);
  (void)ignored;
}

/* 1 when this call of n bytes, made from caller, is the one to fail. */
static int fail_this(const void *caller, size_t n) {
  uintptr_t pc = (uintptr_t)caller;
  int ours = 0;
  for (size_t i = 0; i < sizeof images / sizeof *images; i++)
    ours |= pc >= images[i].lo && pc < images[i].hi;
  if (!ours || !atomic_load(&armed)) return 0;
  long k = atomic_fetch_add(&counted, 1) + 1;
  int by_size = fail_size && n == fail_size && atomic_fetch_add(&sized, 1) + 1 == fail_size_nth;
  if (!by_size && (fail_at <= 0 || k != fail_at)) return 0;
  note_failure(k);
  return 1;
}

void *malloc(size_t n) {
  if (resolving || !ready()) return early_alloc(n);
  if (fail_this(__builtin_return_address(0), n)) return NULL;
  return next_malloc(n);
}

void *calloc(size_t n, size_t size) {
  if (resolving || !ready()) return early_alloc(n * size);
  if (fail_this(__builtin_return_address(0), n * size)) return NULL;
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
  if (fail_this(__builtin_return_address(0), n)) return NULL;
  return next_realloc(p, n);
}

char *strdup(const char *s) {
  if (resolving || !ready()) {
    char *d = early_alloc(strlen(s) + 1);
    return d ? strcpy(d, s) : NULL;
  }
  if (fail_this(__builtin_return_address(0), strlen(s) + 1)) return NULL;
  return next_strdup(s);
}

void free(void *p) {
  if (!p || is_early(p)) return;
  if (ready()) next_free(p);
}
