/* Cluster files and host:port splitting. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster.h"

static dist_member *parse_ok(const char *text, int want_count) {
  dist_member *m = NULL;
  int n = -1;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_cluster_parse(text, "c.conf", &m, &n, &eb), 0, "%s", eb.msg);
  cr_assert_eq(n, want_count);
  return m;
}

static void parse_fails(const char *text, const char *message) {
  dist_member *m = NULL;
  int n = -1;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_expect_eq(dist_cluster_parse(text, "c.conf", &m, &n, &eb), DIST_ECONFIG, "'%s'", text);
  cr_expect_eq(eb.code, DIST_ECONFIG);
  cr_expect_str_eq(eb.msg, message);
  cr_expect_null(m);
}

Test(cluster, ranks_in_order_with_comments_and_default_peer_port) {
  dist_member *m = parse_ok("# three daemons\n"
                            "\n"
                            "127.0.0.1:7470   # rank 0\n"
                            "  node1:7480 node1-data:9000\r\n"
                            "[::1]:7490\n"
                            "   \n",
                            3);
  cr_expect_str_eq(m[0].grpc_addr, "127.0.0.1:7470");
  cr_expect_str_eq(m[0].peer_addr, "127.0.0.1:7471");
  cr_expect_str_eq(m[1].grpc_addr, "node1:7480");
  cr_expect_str_eq(m[1].peer_addr, "node1-data:9000");
  cr_expect_str_eq(m[2].grpc_addr, "[::1]:7490");
  cr_expect_str_eq(m[2].peer_addr, "[::1]:7491");
  free(m);
}

Test(cluster, last_line_without_newline) {
  dist_member *m = parse_ok("a:1\nb:2", 2);
  cr_expect_str_eq(m[1].peer_addr, "b:3");
  free(m);
}

Test(cluster, errors_name_file_and_line) {
  parse_fails("a:1\n# ok\nb:x\n", "c.conf:3: address 'b:x': bad port 'x'");
  parse_fails("a:1 b:2 c:3\n", "c.conf:1: expected HOST:PORT [PEER_HOST:PEER_PORT], got more fields");
  parse_fails("a:1\nnoport\n", "c.conf:2: address 'noport': missing ':PORT'");
  parse_fails("a:70000\n", "c.conf:1: address 'a:70000': bad port '70000'");
  parse_fails("a:0\n", "c.conf:1: address 'a:0': port 0 cannot be dialled");
  parse_fails("a:65535\n", "c.conf:1: 'a:65535': the peer port would be 65536; give PEER_HOST:PORT");
  parse_fails("a:1 b:\n", "c.conf:1: address 'b:': missing port");
  parse_fails("::1:7470\n", "c.conf:1: address '::1:7470': an IPv6 host needs brackets ([::1]:PORT)");
  parse_fails("# nothing\n\n", "c.conf: no members (the cluster is empty)");
  parse_fails("", "c.conf: no members (the cluster is empty)");
}

Test(cluster, split_hostport) {
  char host[64];
  int port = -1;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_split_hostport("example.org:443", host, sizeof host, &port, &eb), 0);
  cr_expect_str_eq(host, "example.org");
  cr_expect_eq(port, 443);
  cr_assert_eq(dist_split_hostport("[fe80::1]:7470", host, sizeof host, &port, &eb), 0);
  cr_expect_str_eq(host, "fe80::1");
  cr_expect_eq(port, 7470);
  cr_assert_eq(dist_split_hostport("127.0.0.1:0", host, sizeof host, &port, &eb), 0);
  cr_expect_eq(port, 0);
  cr_expect_eq(dist_split_hostport("[::1]7470", host, sizeof host, &port, &eb), DIST_EINVAL);
  cr_expect_eq(dist_split_hostport("[::1", host, sizeof host, &port, &eb), DIST_EINVAL);
  cr_expect_eq(dist_split_hostport(":7470", host, sizeof host, &port, &eb), DIST_EINVAL);
  cr_expect(strstr(eb.msg, "missing host") != NULL, "%s", eb.msg);
  cr_expect_eq(dist_split_hostport("host:-1", host, sizeof host, &port, &eb), DIST_EINVAL);
  cr_expect_eq(dist_split_hostport("host:99999999999999999999", host, sizeof host, &port, &eb),
               DIST_EINVAL);
  cr_expect_eq(dist_split_hostport("a-very-long-host-name:1", host, 8, &port, &eb), DIST_EINVAL);
  cr_expect(strstr(eb.msg, "too long") != NULL, "%s", eb.msg);
}

Test(cluster, load_from_file) {
  char path[] = "/tmp/test_cluster.XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  const char *text = "10.0.0.1:7000\n10.0.0.2:7000 10.0.0.2:7100\n";
  cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  dist_member *m = NULL;
  int n = 0;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = dist_cluster_load(path, &m, &n, &eb);
  unlink(path);
  cr_assert_eq(rc, 0, "%s", eb.msg);
  cr_assert_eq(n, 2);
  cr_expect_str_eq(m[0].peer_addr, "10.0.0.1:7001");
  cr_expect_str_eq(m[1].peer_addr, "10.0.0.2:7100");
  free(m);
  cr_expect_eq(dist_cluster_load(path, &m, &n, &eb), DIST_ENOTFOUND);
  cr_expect(strstr(eb.msg, path) != NULL, "%s", eb.msg);
}

Test(cluster, many_members_grow_the_list) {
  char text[64 * 100] = "";
  size_t pos = 0;
  for (int i = 0; i < 100; i++) pos += (size_t)sprintf(text + pos, "host%d:%d\n", i, 8000 + 2 * i);
  dist_member *m = parse_ok(text, 100);
  cr_expect_str_eq(m[99].grpc_addr, "host99:8198");
  cr_expect_str_eq(m[99].peer_addr, "host99:8199");
  free(m);
}
