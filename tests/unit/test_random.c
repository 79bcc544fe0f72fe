/* dist_random_bytes (common/random.c): the kernel's random bits, from
 * /dev/urandom where a sandbox refuses getrandom(2). The refusal is a
 * seccomp filter installed in a forked child, as a container runtime's
 * profile would be. */
#include <criterion/criterion.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "random.h"

/* Makes getrandom fail with EPERM in this process from now on. */
static int refuse_getrandom(void) {
  struct sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getrandom, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

/* Whether two draws of 32 bytes came out (a zero-filled or repeated buffer
 * would mean no bits were taken). */
static int draws_differ(void) {
  uint8_t a[32] = {0}, b[32] = {0}, zero[32] = {0};
  if (dist_random_bytes(a, sizeof a) != 0 || dist_random_bytes(b, sizeof b) != 0) return 0;
  return memcmp(a, b, sizeof a) != 0 && memcmp(a, zero, sizeof a) != 0;
}

Test(random, two_draws_differ) { cr_assert(draws_differ()); }

Test(random, a_sandbox_refusing_getrandom_gets_the_bits_from_urandom) {
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    if (refuse_getrandom() != 0) _exit(3);
    char probe;
    if (syscall(SYS_getrandom, &probe, 1, 0) != -1 || errno != EPERM) _exit(4);
    /* glibc 2.41 on Linux 6.11 and later answers getrandom in the vDSO,
     * which no filter sees: then there is nothing to fall back from. */
    if (getrandom(&probe, 1, 0) == 1) _exit(6);
    _exit(draws_differ() ? 0 : 5);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status), "the child died (status %d)", status);
  if (WEXITSTATUS(status) == 3) cr_skip_test("this machine refuses a seccomp filter");
  if (WEXITSTATUS(status) == 6)
    cr_skip_test("getrandom is answered without a system call here (vDSO): no refusal to test");
  cr_assert_neq(WEXITSTATUS(status), 4, "the filter did not refuse getrandom");
  cr_assert_eq(WEXITSTATUS(status), 0, "no random bits where getrandom is refused");
}
