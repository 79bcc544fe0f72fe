/* dist_cluster_parse on arbitrary text: a cluster file, or the `peers`
 * list once it is split into lines. */
#include "cluster.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size);
  if (!text) return 0;
  dist_member *members = NULL;
  int n = 0;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = dist_cluster_parse(text, "fuzz.cluster", &members, &n, &eb);
  if (rc != 0) {
    fuzz_check_rejection(rc, &eb);
    FUZZ_CHECK(members == NULL);
  } else {
    FUZZ_CHECK(n > 0 && members != NULL);
    /* Every accepted address splits again: callers dial them. */
    for (int i = 0; i < n; i++) {
      char host[256];
      int port = 0;
      FUZZ_CHECK(dist_split_hostport(members[i].grpc_addr, host, sizeof host,
                                     &port, &eb) == 0);
      FUZZ_CHECK(port > 0 && port <= 65535);
      FUZZ_CHECK(dist_split_hostport(members[i].peer_addr, host, sizeof host,
                                     &port, &eb) == 0);
      FUZZ_CHECK(port > 0 && port <= 65535);
    }
  }
  free(members);
  free(text);
  return 0;
}
