//! The local state directory holds every tenant's approvals, conversations and tool results,
//! and the keys that sign tokens: it is private to the user who owns it. It is created 0700 and
//! each file in it 0600; a directory or file found wider than that is reported (the owner may
//! have widened it on purpose, so it is not changed behind their back).

use std::io;
use std::path::{Path, PathBuf};

/// Creates the directory (and missing parents) readable by its owner only. An existing
/// directory is left as it is.
pub fn create(dir: &Path) -> io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Creates the directory if it is missing; if it was there already, warns about it or any file
/// in it that others than its owner may read or write.
pub fn prepare(dir: &Path) -> io::Result<()> {
    if !dir.exists() {
        return create(dir);
    }
    for (path, mode) in wider_than_private(dir)? {
        tracing::warn!(
            path = %path.display(),
            mode = format_args!("{mode:o}"),
            "the state directory holds approvals and signing keys, but others than its owner may \
             read or change this; `chmod 700` the directory and `chmod 600` its files"
        );
    }
    Ok(())
}

/// Creates an empty file readable by its owner only, unless it exists. SQLite gives a
/// database's `-wal` and `-shm` files the mode of the database file, so they follow.
pub fn create_private_file(path: &Path) -> io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// The directory and the files in it whose mode lets group or others in, with that mode.
pub fn wider_than_private(dir: &Path) -> io::Result<Vec<(PathBuf, u32)>> {
    let mut wide = Vec::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |meta: &std::fs::Metadata| meta.permissions().mode() & 0o777;
        let meta = std::fs::metadata(dir)?;
        if mode(&meta) & 0o077 != 0 {
            wide.push((dir.to_path_buf(), mode(&meta)));
        }
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                // Gone since the listing: the `-wal` or `-shm` file of a store whose last
                // connection just closed in another process. Nothing there to warn about.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if meta.is_file() && mode(&meta) & 0o077 != 0 {
                wide.push((entry.path(), mode(&meta)));
            }
        }
    }
    Ok(wide)
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn fresh(name: &str) -> PathBuf {
        crate::testing::scratch_dir(&format!("state-{name}"))
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn files_that_come_and_go_while_the_directory_is_read_are_no_error() {
        // As a store's `-wal` and `-shm` files do when another process's last connection
        // closes while this one opens the directory.
        let dir = fresh("churn");
        create(&dir).unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let (dir, done) = (dir.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    for i in 0..64 {
                        create_private_file(&dir.join(format!("f{i}"))).unwrap();
                    }
                    for i in 0..64 {
                        std::fs::remove_file(dir.join(format!("f{i}"))).unwrap();
                    }
                }
            })
        };
        for _ in 0..500 {
            assert_eq!(wider_than_private(&dir).unwrap(), []);
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        churn.join().unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_existing_directory_open_to_others_is_reported_with_its_wide_files() {
        let dir = fresh("wide");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let db = dir.join("countersign.db");
        std::fs::write(&db, b"").unwrap();
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
        let key = dir.join("dev-jwt.key");
        create_private_file(&key).unwrap();

        let wide = wider_than_private(&dir).unwrap();

        assert_eq!(wide, [(dir.clone(), 0o755), (db.clone(), 0o644)]);
        assert_eq!(mode(&key), 0o600);
        prepare(&dir).unwrap();
        assert_eq!(mode(&dir), 0o755, "reported, not changed");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
