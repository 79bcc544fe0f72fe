/* Certificate revocation lists (tls_crl): the CRLs a daemon holds against
 * the certificates of its peers and clients. The data plane hands them to
 * OpenSSL's verification; the gRPC port, whose credentials take no CRL in
 * grpc 1.51, checks each call's client certificate here. Only the leaf
 * certificate is checked, on both, against a CRL of its own issuer, which
 * tls_crl must hold: a certificate whose issuer has no current CRL there is
 * refused (fail closed, as OpenSSL's X509_V_FLAG_CRL_CHECK does). No gRPC
 * here: the peer tests link this file. */
#ifndef DISTD_CRL_H
#define DISTD_CRL_H

#include <stddef.h>

#include "errbuf.h"

typedef struct distd_crl distd_crl;

/* Parses pem (one or more PEM CRLs; path names it in errors). Each CRL must
 * be signed by a certificate in ca_pem (tls_ca) and not have expired. */
int distd_crl_parse(const char *pem, const char *ca_pem, const char *path,
                    distd_crl **out, dist_errbuf *eb);
void distd_crl_free(distd_crl *c); /* NULL is a no-op */
int distd_crl_count(const distd_crl *c);

/* Adds the CRLs to x509_store (an X509_STORE *) and turns on the checking
 * of leaf certificates against them. 0, or -1 when OpenSSL refused. */
int distd_crl_add_to_store(const distd_crl *c, void *x509_store);

/* 0 when the PEM certificate (len bytes) is not revoked by a current CRL
 * of its issuer; else DIST_EAUTH, saying which certificate and why. It
 * remembers the certificates it let through: callers serialize. */
int distd_crl_check_pem(distd_crl *c, const char *cert_pem, size_t len,
                        dist_errbuf *eb);

#endif
