#!/bin/sh
# Makes the certificates the v1 unit tests read (run in this directory).
# `openssl x509 -req` without -extfile makes an X.509 v1 certificate.
set -e
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
# Two CAs (v3, CA:TRUE), a v1 self-signed certificate, a v3 end entity (CA:FALSE).
openssl req -x509 $ec -days 36500 -subj /CN=ca1 -keyout ca1.key -out ca1.crt 2>/dev/null
openssl req -x509 $ec -days 36500 -subj /CN=ca2 -keyout ca2.key -out ca2.crt 2>/dev/null
openssl req -new $ec -subj /CN=v1ca -keyout v1ca.key -out v1ca.csr.tmp 2>/dev/null
openssl x509 -req -in v1ca.csr.tmp -signkey v1ca.key -days 36500 -out v1ca.crt 2>/dev/null
openssl req -x509 $ec -days 36500 -subj /CN=leafca -addext basicConstraints=critical,CA:FALSE \
    -keyout leafca.key -out leafca.crt 2>/dev/null
# v1 leaves: CN=localhost by ca1, by ca2, by the v1 "CA", by the v3 end entity; *.example.org by ca1.
leaf() {
    openssl req -new $ec -subj "/CN=$3" -keyout $1.key -out $1.csr.tmp 2>/dev/null
    openssl x509 -req -in $1.csr.tmp -CA $2.crt -CAkey $2.key -set_serial 7 -days 36500 -out $1.crt 2>/dev/null
}
leaf localhost-ca1 ca1 localhost
leaf localhost-ca2 ca2 localhost
leaf localhost-v1ca v1ca localhost
leaf localhost-leafca leafca localhost
leaf wild-ca1 ca1 '*.example.org'
rm -f *.tmp ca2.key v1ca.key leafca.key localhost-ca2.key localhost-v1ca.key localhost-leafca.key
