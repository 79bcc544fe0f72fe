/* tls_crl in libdist: the daemons' certificates checked against
 * certificate revocation lists. grpc 1.51's ssl channel credentials take
 * no CRL, but call a verify_peer callback with the daemon's leaf
 * certificate at every handshake; the check is made there. gRPC names
 * only the host to the callback, and daemons of one host may have
 * certificates of their own, so each channel has credentials of its own,
 * which say whose certificate it checks: the reason of a refusal is kept
 * by rank, for the error the failed call reports. */
#ifndef DIST_DAEMON_CRL_H
#define DIST_DAEMON_CRL_H

#include <grpc/grpc_security.h>
#include <stddef.h>

#include "crl.h"

typedef struct dist_daemon_crl dist_daemon_crl;

/* Reads the CRLs at path and checks them against ca_pem, for a client of
 * n daemons. The file is read again at a handshake when it changed (its
 * size, time or inode), so that a long-lived client takes a new CRL when
 * it reconnects; a new file that does not parse leaves the CRLs read
 * before in use. */
int dist_daemon_crl_new(const char *path, const char *ca_pem, int n, dist_daemon_crl **out,
                        dist_errbuf *eb);
/* The verify options of the channel to rank's daemon, for
 * grpc_ssl_credentials_create_ex, whose credentials own them once made
 * (gRPC calls their destructor); else give them to
 * dist_daemon_crl_verify_options_free. -1 when out of memory. */
int dist_daemon_crl_verify_options(dist_daemon_crl *d, int rank,
                                   grpc_ssl_verify_peer_options *o);
void dist_daemon_crl_verify_options_free(grpc_ssl_verify_peer_options *o);
/* Why rank's certificate was refused at the last handshake, into buf; 0
 * when it was not. */
int dist_daemon_crl_refusal(dist_daemon_crl *d, int rank, char *buf, size_t len);
void dist_daemon_crl_release(dist_daemon_crl *d); /* NULL is a no-op */

#endif
