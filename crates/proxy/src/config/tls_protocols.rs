//! PgBouncer's `client_tls_protocols` / `server_tls_protocols` values, read
//! into the TLS versions weir offers. rustls has TLS 1.2 and 1.3 only: an
//! older version in a list is left out (check-config says so), and a value
//! naming only older ones is refused.

/// The TLS versions a value allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TlsVersions {
    pub tls12: bool,
    pub tls13: bool,
    /// TLSv1.0 or TLSv1.1 was asked for (and is not offered).
    pub older: bool,
}

/// Reads a value as PgBouncer does: words separated by commas, colons or
/// spaces, without case: `tlsv1.0` to `tlsv1.3`, `all` / `legacy` (all of
/// them), `secure` / `default` (1.2 and 1.3); `!word` takes one away.
pub fn parse(value: &str) -> Result<TlsVersions, String> {
    // Bits: 1.0, 1.1, 1.2, 1.3.
    let mut on = 0u8;
    for word in value.split([',', ':', ' ', '\t']).filter(|w| !w.is_empty()) {
        let (off, word) = match word.strip_prefix('!') {
            Some(w) => (true, w),
            None => (false, word),
        };
        let bits = match word.to_ascii_lowercase().as_str() {
            "tlsv1.0" => 0b0001,
            "tlsv1.1" => 0b0010,
            "tlsv1.2" => 0b0100,
            "tlsv1.3" => 0b1000,
            "all" | "legacy" => 0b1111,
            "secure" | "default" => 0b1100,
            other => {
                return Err(format!("\"{other}\" is not a TLS protocol (tlsv1.0 to tlsv1.3, all, secure, legacy)"))
            }
        };
        on = if off { on & !bits } else { on | bits };
    }
    let v = TlsVersions { tls12: on & 0b0100 != 0, tls13: on & 0b1000 != 0, older: on & 0b0011 != 0 };
    if !v.tls12 && !v.tls13 {
        return Err("no TLS version weir can offer: rustls has TLSv1.2 and TLSv1.3 only".into());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgbouncer_values_map_to_what_rustls_has() {
        let both = TlsVersions { tls12: true, tls13: true, older: false };
        assert_eq!(parse("secure"), Ok(both));
        assert_eq!(parse("default"), Ok(both));
        assert_eq!(parse("all"), Ok(TlsVersions { older: true, ..both }));
        assert_eq!(parse("TLSv1.3"), Ok(TlsVersions { tls13: true, ..Default::default() }));
        assert_eq!(parse("tlsv1.2, tlsv1.3"), Ok(both));
        assert_eq!(parse("all:!tlsv1.0:!tlsv1.1"), Ok(both));
        assert_eq!(parse("secure !tlsv1.2"), Ok(TlsVersions { tls13: true, ..Default::default() }));
        let old = parse("tlsv1.0").unwrap_err();
        assert!(old.contains("TLSv1.2 and TLSv1.3 only"), "{old}");
        assert!(parse("tlsv1.1,tlsv1.0").is_err());
        assert!(parse("").is_err() && parse("sslv3").unwrap_err().contains("sslv3"));
    }
}
