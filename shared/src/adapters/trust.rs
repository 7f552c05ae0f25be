//! The root certificates Countersign's HTTPS clients trust, read from the system's bundle file:
//! once for the AWS SDK's client, once for all the reqwest clients of a process.
//!
//! Left to themselves, the AWS SDK's HTTPS client and every reqwest client load the platform's
//! roots through rustls-native-certs, which reads the bundle file and then every file of the
//! certificate directory (on Debian, about 145 more files holding the same CAs again), and
//! reqwest does it once more for each client it builds: most of a function's start-up beyond
//! hello world's. The bundle alone holds every root (Lambda's AL2023 keeps them in one file
//! and no directory of its own), so reading it is enough. An explicit `SSL_CERT_DIR` is
//! honoured as before: then the clients load the platform's roots themselves.
//!
//! reqwest clients are given the roots as DER, decoded once per process with a plain base64
//! decoder: the PEM reader of rustls and reqwest is constant-time, made for private keys, and
//! takes twice as long over the bundle's 144 CAs, which are public.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where distributions keep all their roots in one PEM file: AL2023 (Lambda's
/// `provided.al2023`), Fedora and RHEL first, then Debian, Ubuntu and Alpine, then openSUSE.
const BUNDLES: &[&str] = &[
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The DER of each `CERTIFICATE` block of a PEM file; a block that is not base64 is skipped
/// (as rustls-native-certs skips what it cannot read), and any other kind of block ignored.
fn ders(pem: &[u8]) -> Vec<Vec<u8>> {
    use base64::Engine;
    const END: &[u8] = b"-----END CERTIFICATE-----";
    let mut ders = Vec::new();
    // The base64 of the block being read, if one is.
    let mut body: Option<Vec<u8>> = None;
    for line in pem.split(|&b| b == b'\n').map(<[u8]>::trim_ascii) {
        if line == CERTIFICATE.as_bytes() {
            body = Some(Vec::with_capacity(2048));
        } else if line == END {
            if let Some(der) = body
                .take()
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            {
                ders.push(der);
            }
        } else if let Some(body) = body.as_mut() {
            body.extend_from_slice(line);
        }
    }
    ders
}

/// The system bundle's PEM, read now: `None` when the clients should load the platform's roots
/// themselves (`SSL_CERT_DIR` set, or no readable bundle that holds a certificate).
///
/// Which file is the bundle is settled once per process; its text is not kept. Each caller gets
/// the file read afresh and owns it: the SDK's trust store takes its PEM by value, so handing
/// it a copy of a kept buffer would cost a second 220 KB of memory to fault in and fill, in
/// every function's init. The first call, which looks for the bundle, hands over the read it
/// looked with.
pub fn bundle_pem() -> Option<Vec<u8>> {
    static BUNDLE: OnceLock<Option<PathBuf>> = OnceLock::new();
    let mut found = None;
    let path = BUNDLE.get_or_init(|| {
        let from_env = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        if from_env("SSL_CERT_DIR").is_some() {
            return None;
        }
        let (path, pem) = match from_env("SSL_CERT_FILE") {
            Some(file) => read(Path::new(&file))?,
            None => BUNDLES.iter().find_map(|path| read(Path::new(path)))?,
        };
        found = Some(pem);
        Some(path)
    });
    match found {
        Some(pem) => Some(pem),
        None => read(path.as_deref()?).map(|(_, pem)| pem),
    }
}

/// The file's text, when it holds at least one certificate.
fn read(path: &Path) -> Option<(PathBuf, Vec<u8>)> {
    let pem = std::fs::read(path).ok()?;
    let holds_one = pem
        .windows(CERTIFICATE.len())
        .any(|w| w == CERTIFICATE.as_bytes());
    holds_one.then(|| (path.to_path_buf(), pem))
}

/// The bundle's roots as reqwest takes them, decoded when a reqwest client first needs them
/// (once per process); empty when the clients load the platform's roots themselves.
fn certificates() -> &'static [reqwest::Certificate] {
    static CERTIFICATES: OnceLock<Vec<reqwest::Certificate>> = OnceLock::new();
    CERTIFICATES.get_or_init(|| {
        let Some(pem) = bundle_pem() else {
            return Vec::new();
        };
        ders(&pem)
            .iter()
            .filter_map(|der| reqwest::Certificate::from_der(der).ok())
            .collect()
    })
}

const CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----";

/// A reqwest client builder that trusts the bundle's roots, read once for every client.
pub fn client_builder() -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder();
    match certificates() {
        [] => builder,
        roots => builder.tls_certs_only(roots.iter().cloned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_file_gives_its_certificates_and_anything_else_gives_none() {
        let dir = std::env::temp_dir().join(format!("countersign-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        assert!(read(&empty).is_none());
        assert!(read(&dir.join("missing.pem")).is_none());
        // The process's own choice: the bundle, unless the environment names a directory.
        let dir_named = std::env::var_os("SSL_CERT_DIR").is_some_and(|v| !v.is_empty());
        let bundle = std::env::var_os("SSL_CERT_FILE")
            .filter(|v| !v.is_empty())
            .map(|file| read(Path::new(&file)).is_some())
            .unwrap_or_else(|| BUNDLES.iter().any(|p| read(Path::new(p)).is_some()));
        let expected = bundle && !dir_named;
        assert_eq!(bundle_pem().is_some(), expected);
        assert_eq!(!certificates().is_empty(), expected);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn each_certificate_block_is_decoded_and_anything_else_is_passed_over() {
        let pem = "junk before\n\
            -----BEGIN CERTIFICATE-----\nMIIB\r\nAQID\n-----END CERTIFICATE-----\n\
            -----BEGIN PRIVATE KEY-----\nBAUG\n-----END PRIVATE KEY-----\n\
            -----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n\
            -----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n\
            -----BEGIN CERTIFICATE-----\nMAA=\n";
        assert_eq!(
            ders(pem.as_bytes()),
            vec![vec![0x30, 0x82, 0x01, 0x01, 0x02, 0x03], vec![0x30, 0x00]]
        );
        assert!(ders(b"").is_empty());
    }

    #[test]
    fn the_system_bundle_decodes_to_one_der_certificate_per_block() {
        let Some((_, pem)) = BUNDLES.iter().find_map(|p| read(Path::new(p))) else {
            return;
        };
        let blocks = pem
            .windows(CERTIFICATE.len())
            .filter(|w| *w == CERTIFICATE.as_bytes())
            .count();
        let ders = ders(&pem);
        assert_eq!(ders.len(), blocks);
        // Each is an X.509 certificate: a DER SEQUENCE with a two-byte length.
        assert!(ders.iter().all(|der| der.starts_with(&[0x30, 0x82])));
        client_builder()
            .build()
            .expect("a client trusting the bundle");
    }
}
