/* Certificate revocation lists: parsed and checked against tls_ca once
 * per start or reload, then consulted per handshake or call. */
#include "crl.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_CRLS 64
#define ACCEPTED_CACHE 16

/* A certificate dist_crl_check_pem let through, and the CRL that said so
 * (its expiry is checked again at every hit). */
typedef struct {
  char *pem;
  size_t len;
  int crl;
} accepted;

struct dist_crl {
  atomic_int refs;
  X509_CRL *crls[MAX_CRLS];
  int n;
  /* OpenSSL 3.0 takes about half a millisecond to parse a certificate
   * here (its key decoders): a call may not pay that, so the certificates
   * let through are remembered by their PEM text, for the CRLs' life. */
  accepted ok[ACCEPTED_CACHE];
  int ok_next;
};

dist_crl *dist_crl_ref(dist_crl *c) {
  atomic_fetch_add(&c->refs, 1);
  return c;
}

void dist_crl_free(dist_crl *c) {
  if (!c || atomic_fetch_sub(&c->refs, 1) > 1) return;
  for (int i = 0; i < c->n; i++) X509_CRL_free(c->crls[i]);
  for (int i = 0; i < ACCEPTED_CACHE; i++) free(c->ok[i].pem);
  free(c);
}

int64_t dist_asn1_time_unix(const void *asn1_time) {
  struct tm tm;
  if (!asn1_time || ASN1_TIME_to_tm(asn1_time, &tm) != 1) return 0;
  return (int64_t)timegm(&tm);
}

int64_t dist_crl_next_update(const dist_crl *c) {
  int64_t first = 0;
  for (int i = 0; c && i < c->n; i++) {
    int64_t t = dist_asn1_time_unix(X509_CRL_get0_nextUpdate(c->crls[i]));
    if (t && (!first || t < first)) first = t;
  }
  return first;
}

static void name_of(const X509_NAME *name, char *buf, int len) {
  if (!X509_NAME_oneline(name, buf, len)) snprintf(buf, (size_t)len, "?");
}

/* Whether a certificate in ca_pem has crl's issuer as subject and signed
 * it. */
static int signed_by_a_ca(X509_CRL *crl, const char *ca_pem) {
  BIO *b = BIO_new_mem_buf(ca_pem, -1);
  X509 *ca;
  int ok = 0;
  while (!ok && b && (ca = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL) {
    ok = X509_NAME_cmp(X509_get_subject_name(ca), X509_CRL_get_issuer(crl)) == 0 &&
         X509_CRL_verify(crl, X509_get0_pubkey(ca)) == 1;
    X509_free(ca);
  }
  BIO_free(b);
  ERR_clear_error(); /* the end of the text reads as "no start line" */
  return ok;
}

static int expired(const X509_CRL *crl) {
  const ASN1_TIME *next = X509_CRL_get0_nextUpdate(crl);
  return next && X509_cmp_current_time(next) < 0;
}

/* Takes crl into c once it checks out against ca_pem. */
static int add_checked(dist_crl *c, X509_CRL *crl, const char *ca_pem,
                       const char *path, dist_errbuf *eb) {
  char issuer[256];
  name_of(X509_CRL_get_issuer(crl), issuer, sizeof issuer);
  int rc = 0;
  if (c->n == MAX_CRLS)
    rc = dist_fail(eb, DIST_ECONFIG, "tls_crl %s: more than %d CRLs", path, MAX_CRLS);
  else if (!signed_by_a_ca(crl, ca_pem))
    rc = dist_fail(eb, DIST_ECONFIG, "tls_crl %s: the CRL of %s is not signed by a "
                   "certificate in tls_ca", path, issuer);
  else if (expired(crl))
    rc = dist_fail(eb, DIST_ECONFIG, "tls_crl %s: the CRL of %s has expired (its "
                   "next update is past)", path, issuer);
  if (rc != 0) {
    X509_CRL_free(crl);
    return rc;
  }
  c->crls[c->n++] = crl;
  return 0;
}

int dist_crl_parse(const char *pem, const char *ca_pem, const char *path,
                    dist_crl **out, dist_errbuf *eb) {
  *out = NULL;
  if (!ca_pem) return dist_fail(eb, DIST_ECONFIG, "tls_crl needs tls_ca");
  dist_crl *c = calloc(1, sizeof *c);
  BIO *b = c ? BIO_new_mem_buf(pem, -1) : NULL;
  if (!b) {
    free(c);
    return dist_fail(eb, DIST_ENOMEM, "tls_crl %s: out of memory", path);
  }
  atomic_init(&c->refs, 1);
  X509_CRL *crl;
  int rc = 0;
  ERR_clear_error();
  while (rc == 0 && (crl = PEM_read_bio_X509_CRL(b, NULL, NULL, NULL)) != NULL)
    rc = add_checked(c, crl, ca_pem, path, eb);
  BIO_free(b);
  ERR_clear_error();
  if (rc == 0 && c->n == 0)
    rc = dist_fail(eb, DIST_ECONFIG, "tls_crl %s: no CRL in it (a PEM \"X509 CRL\")",
                   path);
  if (rc != 0) {
    dist_crl_free(c);
    return rc;
  }
  *out = c;
  return 0;
}

int dist_crl_add_to_store(const dist_crl *c, void *x509_store) {
  X509_STORE *store = x509_store;
  for (int i = 0; i < c->n; i++)
    if (X509_STORE_add_crl(store, c->crls[i]) != 1) return -1;
  return X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK) == 1 ? 0 : -1;
}

/* The index of the CRL of cert's issuer, or -1. */
static int crl_of_issuer(const dist_crl *c, const X509 *cert) {
  for (int i = 0; i < c->n; i++)
    if (X509_NAME_cmp(X509_CRL_get_issuer(c->crls[i]), X509_get_issuer_name(cert)) == 0)
      return i;
  return -1;
}

/* Why cert may not be used, in buf, after its subject ("/CN=x is revoked
 * (SOURCE)", source naming where the CRL came from); 0 when it may
 * (*by: the CRL that says so). */
static int refusal(const dist_crl *c, X509 *cert, const char *source, int *by, char *buf,
                   size_t len) {
  char subject[256], issuer[256];
  name_of(X509_get_subject_name(cert), subject, sizeof subject);
  name_of(X509_get_issuer_name(cert), issuer, sizeof issuer);
  *by = crl_of_issuer(c, cert);
  X509_CRL *crl = *by >= 0 ? c->crls[*by] : NULL;
  X509_REVOKED *revoked = NULL;
  if (!crl)
    snprintf(buf, len, "%s is refused: tls_crl holds no CRL of its issuer %s", subject,
             issuer);
  else if (expired(crl))
    snprintf(buf, len, "%s is refused: the CRL of its issuer %s has expired", subject,
             issuer);
  else if (X509_CRL_get0_by_cert(crl, &revoked, cert) == 1)
    snprintf(buf, len, "%s is revoked (%s)", subject, source);
  else
    return 0;
  return 1;
}

/* 1 when pem was let through before and its CRL is still current. */
static int accepted_before(const dist_crl *c, const char *pem, size_t len) {
  for (int i = 0; i < ACCEPTED_CACHE; i++) {
    const accepted *a = &c->ok[i];
    if (a->pem && a->len == len && memcmp(a->pem, pem, len) == 0)
      return !expired(c->crls[a->crl]);
  }
  return 0;
}

static void remember_accepted(dist_crl *c, const char *pem, size_t len, int crl) {
  char *copy = malloc(len);
  if (!copy) return; /* it is parsed again next time */
  memcpy(copy, pem, len);
  accepted *a = &c->ok[c->ok_next];
  c->ok_next = (c->ok_next + 1) % ACCEPTED_CACHE;
  free(a->pem);
  *a = (accepted){copy, len, crl};
}

int dist_crl_check_pem(dist_crl *c, const char *cert_pem, size_t len,
                        dist_errbuf *eb) {
  if (accepted_before(c, cert_pem, len)) return 0;
  BIO *b = BIO_new_mem_buf(cert_pem, (int)len);
  X509 *cert = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
  BIO_free(b);
  ERR_clear_error();
  if (!cert) return dist_fail(eb, DIST_EAUTH, "the certificate cannot be read");
  char why[700];
  int by = -1, refused = refusal(c, cert, "tls_crl", &by, why, sizeof why);
  X509_free(cert);
  if (refused) return dist_fail(eb, DIST_EAUTH, "the certificate %s", why);
  remember_accepted(c, cert_pem, len, by);
  return 0;
}
