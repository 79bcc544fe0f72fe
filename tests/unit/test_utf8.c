/* UTF-8 validity (common/utf8.c): the cases RFC 3629 names, and agreement
 * with jansson's own check (json_stringn answers NULL for invalid UTF-8)
 * on random byte strings. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "jansson_failing.h"
#include "tensor.h"
#include "utf8.h"

static int valid(const char *s) { return dist_utf8_valid(s, strlen(s)); }

Test(utf8, accepts_every_length_of_character) {
  cr_assert(valid(""));
  cr_assert(valid("plain ascii"));
  cr_assert(valid("caf\xc3\xa9"));             /* U+00E9 */
  cr_assert(valid("\xe2\x82\xac"));            /* U+20AC */
  cr_assert(valid("\xf0\x9f\x98\x80"));        /* U+1F600 */
  cr_assert(valid("\xf4\x8f\xbf\xbf"));        /* U+10FFFF, the last */
  cr_assert(dist_utf8_valid("a\0b", 3));       /* NUL is a character */
}

Test(utf8, refuses_what_rfc_3629_excludes) {
  cr_assert(!valid("caf\xe9"));                /* Latin-1 */
  cr_assert(!valid("\xc0\xaf"));               /* overlong '/' */
  cr_assert(!valid("\xe0\x80\xaf"));           /* overlong, 3 bytes */
  cr_assert(!valid("\xf0\x80\x80\xaf"));       /* overlong, 4 bytes */
  cr_assert(!valid("\xed\xa0\x80"));           /* U+D800, a surrogate */
  cr_assert(!valid("\xf4\x90\x80\x80"));       /* U+110000 */
  cr_assert(!valid("\xf8\x88\x80\x80\x80"));   /* 5 bytes */
  cr_assert(!valid("\x80"));                   /* a lone continuation */
  cr_assert(!valid("\xe2\x82"));               /* cut short */
  cr_assert(!valid("\xe2(\xac"));              /* a broken continuation */
}

/* Strings mostly of bytes that start or continue characters, so that
 * valid ones come up often; jansson is the reference. */
Test(utf8, agrees_with_jansson_on_random_bytes) {
  static const unsigned char pool[] = {'a', 0x80, 0x8f, 0x9f, 0xa0, 0xbf, 0xc0, 0xc2,
                                       0xdf, 0xe0, 0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff};
  unsigned seed = 31;
  int seen_valid = 0;
  for (int i = 0; i < 200000; i++) {
    char s[6];
    size_t len = (size_t)(rand_r(&seed) % 6);
    for (size_t j = 0; j < len; j++) s[j] = (char)pool[rand_r(&seed) % sizeof pool];
    json_t *j = json_stringn(s, len);
    cr_assert_eq(dist_utf8_valid(s, len), j != NULL, "bytes %zu: %02x %02x %02x %02x %02x",
                 len, (unsigned char)s[0], (unsigned char)s[1], (unsigned char)s[2],
                 (unsigned char)s[3], (unsigned char)s[4]);
    seen_valid += j != NULL && len > 1;
    json_decref(j);
  }
  cr_assert_gt(seen_valid, 1000);
}

/* A name's check allocates nothing: through jansson it called a valid name
 * not UTF-8 whenever jansson could not allocate. */
Test(utf8, a_name_check_holds_when_jansson_cannot_allocate) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  jansson_fail_from_now(1);
  int rc = dist_name_check("caf\xc3\xa9", &eb);
  jansson_restore();
  cr_assert_eq(rc, 0, "%s", eb.msg);
  cr_assert_eq(dist_name_check("caf\xe9", &eb), DIST_EINVAL);
}
