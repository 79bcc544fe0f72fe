/* distd's config file parser (dist_cfg_parse_file_text with the distd
 * table), then what distd does next with the result: print it
 * (--check-config) and read the membership from `peers` or `listen`. */
#include "../../daemon/config.h"
#include "fuzz_check.h"

static FILE *devnull(void) {
  static FILE *f;
  if (!f) f = fopen("/dev/null", "w");
  return f;
}

/* The membership distd derives from the configuration. A cluster_file is
 * not opened: the fuzzer would be reading files named by its input. */
static void check_members(const distd_config *cfg) {
  if (cfg->cluster_file[0]) return;
  dist_member *members = NULL;
  int n = 0;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = distd_members_load(cfg, &members, &n, &eb);
  if (rc != 0) {
    fuzz_check_rejection(rc, &eb);
    FUZZ_CHECK(members == NULL);
    return;
  }
  FUZZ_CHECK(n > cfg->rank);
  for (int i = 0; i < n; i++) {
    FUZZ_CHECK(memchr(members[i].grpc_addr, 0, sizeof members[i].grpc_addr));
    FUZZ_CHECK(memchr(members[i].peer_addr, 0, sizeof members[i].peer_addr));
  }
  free(members);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size);
  if (!text) return 0;
  distd_config cfg;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  FUZZ_CHECK(dist_cfg_defaults(&distd_config_table, &cfg, &eb) == 0);
  int rc = dist_cfg_parse_file_text(&distd_config_table, &cfg, text,
                                    "fuzz.conf", &eb);
  if (rc != 0) {
    fuzz_check_rejection(rc, &eb);
    FUZZ_CHECK(rc == DIST_ECONFIG);
  } else {
    dist_cfg_print(&distd_config_table, &cfg, devnull());
    FUZZ_CHECK(cfg.rank >= 0 && cfg.rank <= 65535);
    FUZZ_CHECK(cfg.max_message_size >= 1024);
    FUZZ_CHECK(cfg.log_level >= 0 && cfg.log_level < 4);
    check_members(&cfg);
  }
  dist_cfg_free(&distd_config_table, &cfg);
  free(text);
  return 0;
}
