#!/usr/bin/env bash
# Makes a throwaway PKI for the TLS tests in DIR (nothing of it is committed):
#   ca.pem/ca.key          the test CA
#   server.pem/server.key  a server certificate from that CA for IP:127.0.0.1 and DNS:localhost
#   client.pem/client.key  a client certificate from that CA (mutual TLS)
#   wrongname.pem/.key     a server certificate from the test CA for another name only
#   other-ca.pem           an unrelated CA (a client trusting only it must refuse the server)
#   other.pem/other.key    a server certificate from the unrelated CA
# Keys are P-256, valid for one day, mode 0600.
#
#   tls_make_certs.sh DIR
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"
umask 077
command -v openssl >/dev/null || { echo "openssl CLI not found" >&2; exit 3; }
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() {  # NAME CN
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 1 -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" 2>/dev/null
}
leaf() {  # NAME CA CN EXT
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$3" 2>/dev/null
  printf '%s\n' "$4" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" \
    -days 1 -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
ca ca rdkv-test-ca
ca other-ca rdkv-other-ca
leaf server ca rdkv-test-server "subjectAltName=IP:127.0.0.1,DNS:localhost"
leaf client ca rdkv-test-client "extendedKeyUsage=clientAuth"
leaf wrongname ca rdkv-test-wrongname "subjectAltName=DNS:not-this-host.example"
leaf other other-ca rdkv-other-server "subjectAltName=IP:127.0.0.1,DNS:localhost"
