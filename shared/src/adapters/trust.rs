//! The root certificates Countersign's HTTPS clients trust, read once per process from the
//! system's bundle file.
//!
//! Left to themselves, the AWS SDK's HTTPS client and every reqwest client load the platform's
//! roots through rustls-native-certs, which reads the bundle file and then every file of the
//! certificate directory (on Debian, about 145 more files holding the same CAs again), and
//! reqwest does it once more for each client it builds: most of a function's start-up beyond
//! hello world's. The bundle alone holds every root (Lambda's AL2023 keeps them in one file
//! and no directory of its own), so one read of it is enough. An explicit `SSL_CERT_DIR` is
//! honoured as before: then the clients load the platform's roots themselves.

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

/// The roots of one bundle file, as PEM and, decoded when a reqwest client first needs them,
/// as reqwest takes them (decoding is most of the cost: each is done once per process).
pub struct Roots {
    pub path: PathBuf,
    pub pem: Vec<u8>,
    certificates: OnceLock<Vec<reqwest::Certificate>>,
}

impl Roots {
    fn certificates(&self) -> &[reqwest::Certificate] {
        self.certificates
            .get_or_init(|| reqwest::Certificate::from_pem_bundle(&self.pem).unwrap_or_default())
    }
}

/// The system's roots, read on first use; `None` when the clients should load the platform's
/// roots themselves (`SSL_CERT_DIR` set, or no readable bundle that holds a certificate).
pub fn roots() -> Option<&'static Roots> {
    static ROOTS: OnceLock<Option<Roots>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let from_env = |name| std::env::var_os(name).filter(|v| !v.is_empty());
            if from_env("SSL_CERT_DIR").is_some() {
                return None;
            }
            match from_env("SSL_CERT_FILE") {
                Some(file) => read(Path::new(&file)),
                None => BUNDLES.iter().find_map(|path| read(Path::new(path))),
            }
        })
        .as_ref()
}

fn read(path: &Path) -> Option<Roots> {
    let pem = std::fs::read(path).ok()?;
    let holds_one = pem
        .windows(CERTIFICATE.len())
        .any(|w| w == CERTIFICATE.as_bytes());
    holds_one.then(|| Roots {
        path: path.to_path_buf(),
        pem,
        certificates: OnceLock::new(),
    })
}

const CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----";

/// A reqwest client builder that trusts the bundle's roots, read once for every client.
pub fn client_builder() -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder();
    match roots() {
        Some(roots) if !roots.certificates().is_empty() => {
            builder.tls_certs_only(roots.certificates().iter().cloned())
        }
        _ => builder,
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
        if let Some(system) = BUNDLES.iter().find_map(|p| read(Path::new(p))) {
            assert!(!system.certificates().is_empty());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
