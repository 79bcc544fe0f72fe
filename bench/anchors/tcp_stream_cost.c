/* What one loopback TCP byte costs here, at best: one stream, a sender and
 * a receiver pinned to different CPUs, nothing else to do. Reports the CPU
 * time both sides spend per message of S bytes (their threads' own time,
 * which leaves out softirq work the kernel accounts elsewhere: a lower
 * bound), for a few write sizes and socket buffer settings, and the best
 * of them. Against memcpy_bw's figure this says how close any TCP
 * all-to-all can come to the two-copy floor on this machine (bench/table.py).
 *   tcp_stream_cost [-s 16M] [-t target_s_per_setting] [-r rounds]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"

static double process_cpu(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu % (int)sysconf(_SC_NPROCESSORS_ONLN), &s);
  sched_setaffinity(0, sizeof s, &s);
}

static void io_all(int fd, void *buf, size_t len, size_t chunk, int writing) {
  unsigned char *p = buf;
  for (size_t o = 0; o < len;) {
    size_t n = len - o < chunk ? len - o : chunk;
    ssize_t k = writing ? write(fd, p + o, n) : read(fd, p + o, n);
    if (k <= 0) die(writing ? "write" : "read");
    o += (size_t)k;
  }
}

static void set_opts(int fd, int sockbuf) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (sockbuf) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof sockbuf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof sockbuf);
  }
}

static unsigned char pattern(size_t i) { return (unsigned char)(i * 31 + 7); }

/* What one side does: `count` messages of S bytes out (writer thread)
 * and/or in (this thread). */
typedef struct {
  int fd;
  size_t S, chunk;
  uint32_t count;
  unsigned char *buf;
} flow;

static void *write_flow(void *arg) {
  flow *f = arg;
  for (uint32_t i = 0; i < f->count; i++) io_all(f->fd, f->buf, f->S, f->chunk, 1);
  return NULL;
}

static void read_flow(flow *f) {
  for (uint32_t i = 0; i < f->count; i++) io_all(f->fd, f->buf, f->S, f->chunk, 0);
}

/* Runs the side's flows: out (a thread) and in (here) at once. */
static void run_flows(flow *out, flow *in) {
  pthread_t t;
  if (out && pthread_create(&t, NULL, write_flow, out)) die("pthread_create");
  if (in) read_flow(in);
  if (out) pthread_join(t, NULL);
}

/* One side of a setting: 3 untimed messages (the first received one
 * checked byte by byte), then n timed; returns this process's CPU seconds
 * for the timed ones, and their wall time in *wall. The parent sends, the
 * child receives, and with both_ways each does both. */
static double side(int fd, size_t S, size_t chunk, uint32_t n, int sends, int receives,
                   double *wall) {
  unsigned char *sbuf = malloc(S), *rbuf = malloc(S);
  for (size_t i = 0; i < S; i++) sbuf[i] = pattern(i);
  flow out = {fd, S, chunk, 3, sbuf}, in = {fd, S, chunk, 3, rbuf};
  run_flows(sends ? &out : NULL, receives ? &in : NULL);
  for (size_t i = 0; receives && i < S; i++)
    if (rbuf[i] != pattern(i)) { fprintf(stderr, "tcp_stream_cost: byte %zu differs\n", i); exit(3); }
  out.count = in.count = n;
  double c0 = process_cpu(), t0 = bench_now();
  run_flows(sends ? &out : NULL, receives ? &in : NULL);
  double cpu = process_cpu() - c0;
  *wall = bench_now() - t0;
  free(sbuf);
  free(rbuf);
  return cpu;
}

/* One setting: the CPU seconds per message moved, both processes; *wall
 * gets the sender's seconds per timed message (per pair, both ways). */
static double one_setting(size_t S, size_t chunk, int sockbuf, uint32_t n, int both_ways,
                          double *wall) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  if (bind(ls, (struct sockaddr *)&a, sizeof a) || getsockname(ls, (struct sockaddr *)&a, &alen) ||
      listen(ls, 1))
    die("listen");
  fflush(stdout);
  pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    pin(1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    set_opts(fd, sockbuf);
    if (connect(fd, (const struct sockaddr *)&a, sizeof a)) die("connect");
    double wall_here, cpu = side(fd, S, chunk, n, both_ways, 1, &wall_here);
    io_all(fd, &cpu, sizeof cpu, sizeof cpu, 1);
    exit(0);
  }
  pin(0);
  int fd = accept(ls, NULL, NULL);
  if (fd < 0) die("accept");
  close(ls);
  set_opts(fd, sockbuf);
  double cpu = side(fd, S, chunk, n, 1, both_ways, wall), peer_cpu;
  io_all(fd, &peer_cpu, sizeof peer_cpu, sizeof peer_cpu, 0);
  *wall /= n;
  int status;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status))
    die("receiver");
  close(fd);
  return (cpu + peer_cpu) / n / (both_ways ? 2 : 1);
}

int main(int argc, char **argv) {
  size_t S = 16u << 20;
  int rounds = 3, n = 20, c;
  while ((c = getopt(argc, argv, "s:n:r:")) != -1) {
    if (c == 's') bench_parse_sizes(optarg, &S, 1);
    else if (c == 'n') n = atoi(optarg);
    else if (c == 'r') rounds = atoi(optarg);
    else return 2;
  }
  const size_t chunks[] = {256u << 10, 2u << 20, S};
  const int sockbufs[] = {0, 32 << 20}; /* 0: the kernel's autotuning */
  double best = 1e30;
  char sb[32], cb[32];
  bench_fmt_size(S, sb);
  for (int r = 0; r < rounds; r++)
    for (size_t i = 0; i < sizeof chunks / sizeof *chunks; i++)
      for (size_t j = 0; j < sizeof sockbufs / sizeof *sockbufs; j++) {
        for (int both = 0; both < 2; both++) {
          double wall, cpu = one_setting(S, chunks[i], sockbufs[j], (uint32_t)n, both, &wall);
          printf("TCPSTREAM size=%s ways=%d chunk=%s sockbuf=%d cpu_us=%.1f wall_us=%.1f\n", sb,
                 both + 1, bench_fmt_size(chunks[i], cb), sockbufs[j], cpu * 1e6, wall * 1e6);
          if (cpu < best) best = cpu;
        }
      }
  printf("TCPSTREAM_BEST size=%s cpu_us=%.1f\n", sb, best * 1e6);
  return 0;
}
