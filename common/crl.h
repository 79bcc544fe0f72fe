/* Certificate revocation lists (tls_crl): the CRLs a daemon holds against
 * the certificates of its peers and clients, and libdist against the
 * daemons' certificates. The data plane hands them to OpenSSL's
 * verification; the gRPC port, whose credentials take no CRL in grpc 1.51,
 * and libdist, through gRPC's verify_peer callback, check a PEM
 * certificate here. Only the leaf certificate is checked, against a CRL of
 * its own issuer, which tls_crl must hold: a certificate whose issuer has
 * no current CRL there is refused (fail closed, as OpenSSL's
 * X509_V_FLAG_CRL_CHECK does). No gRPC here: the peer tests link this
 * file. */
#ifndef DIST_CRL_H
#define DIST_CRL_H

#include <stddef.h>
#include <stdint.h>

#include "errbuf.h"

typedef struct dist_crl dist_crl;

/* Parses pem (one or more PEM CRLs; path names it in errors). Each CRL must
 * be signed by a certificate in ca_pem (tls_ca) and not have expired. The
 * result has one reference. */
int dist_crl_parse(const char *pem, const char *ca_pem, const char *path,
                   dist_crl **out, dist_errbuf *eb);
/* Another reference to c (parsed once, shared by the gRPC port and the
 * data plane); returns c. */
dist_crl *dist_crl_ref(dist_crl *c);
void dist_crl_free(dist_crl *c); /* drops a reference; NULL is a no-op */
/* The earliest next update of c's CRLs, in seconds since the epoch: past
 * it, every certificate of that issuer is refused until a new CRL is
 * loaded. 0 when none names one. */
int64_t dist_crl_next_update(const dist_crl *c);
/* An ASN1_TIME * (a CRL's next update, a certificate's notAfter) in
 * seconds since the epoch; 0 when OpenSSL cannot read it. */
int64_t dist_asn1_time_unix(const void *asn1_time);

/* Adds the CRLs to x509_store (an X509_STORE *) and turns on the checking
 * of leaf certificates against them. 0, or -1 when OpenSSL refused. */
int dist_crl_add_to_store(const dist_crl *c, void *x509_store);

/* 0 when the PEM certificate (len bytes) is not revoked by a current CRL
 * of its issuer; else DIST_EAUTH, saying which certificate and why. It
 * remembers the certificates it let through: callers serialize. */
int dist_crl_check_pem(dist_crl *c, const char *cert_pem, size_t len,
                       dist_errbuf *eb);

#endif
