//! The embedded store's SQLite VFS: the platform's own, with a commit's WAL frames written to
//! the file in one system call.
//!
//! SQLite writes each frame of a commit with two `pwrite`s (its 24-byte header, then its page)
//! and then syncs the log: a lifecycle's seven commits made about 75 writes, and on a virtual
//! machine each costs microseconds in the kernel whatever its size. Here the writes to a WAL
//! file that follow one another are kept in memory and go to the file as one write just
//! before anything else is done with it: its sync, a read, its size, a truncation, a file
//! control, its close.
//!
//! Nothing that was durable stops being so. A commit's frames are synced before the commit
//! returns (the store runs `synchronous=FULL` on every connection), and the sync writes them
//! first; SQLite publishes a commit to other connections (the WAL index) only after that sync.
//! Frames not yet synced belong to no commit: a crash loses them with or without this layer,
//! and SQLite ignores them on recovery. A failed write of the kept frames fails the sync, so the
//! commit fails as it would have on its own write. The store must keep `synchronous=FULL`:
//! with `NORMAL`, SQLite would publish frames this layer still held.
//!
//! Only the WAL file is wrapped: the database file, its shared memory and every other file are
//! the platform VFS's own objects, untouched.

use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

use rusqlite::ffi;

/// The name the store's connections open their file with.
const NAME: &CStr = c"countersign";

/// Bytes kept in memory at most before they are written anyway: a commit bigger than this (a
/// large run's item and its index) is written in pieces of about this size. The platform's
/// write takes less than 128 KiB at a time (SQLite's unix VFS masks the length to 17 bits).
const MAX_KEPT: usize = 64 << 10;

/// The VFS's name, registered with SQLite on the first call; `None` if there is no platform
/// VFS to wrap (the store then opens its file on SQLite's default).
pub fn name() -> Option<&'static CStr> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    REGISTERED.get_or_init(register).then_some(NAME)
}

/// The platform VFS this one forwards to, set once by [`register`].
static PLATFORM: OnceLock<Platform> = OnceLock::new();

struct Platform {
    vfs: *mut ffi::sqlite3_vfs,
    /// Where a WAL file's platform object starts inside the file object SQLite allocates.
    inner_at: usize,
}

// The platform VFS is a static of SQLite's, registered for the life of the process and only
// read here.
unsafe impl Send for Platform {}
unsafe impl Sync for Platform {}

fn register() -> bool {
    // SAFETY: `sqlite3_vfs_find` only reads SQLite's list of registered VFSes (initializing the
    // library first if needed); the default one is a static that lives as long as the process.
    let platform = unsafe { ffi::sqlite3_vfs_find(std::ptr::null()) };
    if platform.is_null() {
        return false;
    }
    let inner_at = std::mem::size_of::<WalFile>().next_multiple_of(16);
    // SAFETY: `platform` is SQLite's default VFS, valid for the process's life (above).
    let mut vfs = unsafe { std::ptr::read(platform) };
    let Some(inner_size) = usize::try_from(vfs.szOsFile).ok() else {
        return false;
    };
    // Every file object SQLite allocates for this VFS has room for the platform's object after
    // the layer's own fields; a file that is not a WAL uses the same memory as the platform's
    // object alone.
    vfs.szOsFile = c_int::try_from(inner_at + inner_size).expect("a file object's size fits");
    vfs.zName = NAME.as_ptr();
    vfs.pNext = std::ptr::null_mut();
    vfs.xOpen = Some(open);
    // The other methods stay the platform's, which read the platform's `pAppData` (kept in the
    // copy) and never their own VFS's other fields.
    let _ = PLATFORM.set(Platform {
        vfs: platform,
        inner_at,
    });
    let vfs: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(vfs));
    // SAFETY: `vfs` lives for the rest of the process, as SQLite requires of a registered VFS;
    // it is registered once (`name` calls this through a `OnceLock`) and never as the default.
    unsafe { ffi::sqlite3_vfs_register(vfs, 0) == ffi::SQLITE_OK }
}

/// A WAL file: the frames written since the file's last write, and the platform's object.
#[repr(C)]
struct WalFile {
    /// SQLite's part of every file object: this layer's methods.
    base: ffi::sqlite3_file,
    /// Writes kept, one after another in the file from `kept_at`.
    kept: Vec<u8>,
    kept_at: i64,
    writes: WalWrites,
}

/// The writes SQLite asked of a connection's WAL file since it opened, and those made to the
/// file: how many write system calls a commit's frames were folded into.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalWrites {
    pub asked: u64,
    pub made: u64,
}

/// The writes of `conn`'s WAL file so far; `None` before its first transaction opens the log,
/// or if the connection's file is not of this VFS.
pub fn wal_writes(conn: &rusqlite::Connection) -> Option<WalWrites> {
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: `SQLITE_FCNTL_JOURNAL_POINTER` writes the pager's log file object (or null) to
    // `file` and touches nothing else; `conn` is borrowed, so its files stay open meanwhile.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_JOURNAL_POINTER,
            (&raw mut file).cast(),
        )
    };
    // SAFETY: a file whose methods are this layer's was opened by `open` as a `WalFile`.
    unsafe {
        let is_wal =
            rc == ffi::SQLITE_OK && !file.is_null() && std::ptr::eq((*file).pMethods, &WAL_METHODS);
        is_wal.then(|| (*file.cast::<WalFile>()).writes)
    }
}

static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    // No shared memory or memory mapping: SQLite asks those of the database file, never of
    // its log.
    iVersion: 1,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

fn platform() -> &'static Platform {
    PLATFORM
        .get()
        .expect("the VFS is registered before a file opens")
}

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let platform = platform();
    // SAFETY: the platform VFS's `xOpen` is given its own VFS and, for a file other than a WAL,
    // the object SQLite allocated (at least the platform's `szOsFile` long); for a WAL, the
    // part of that object past this layer's fields, which is exactly that long.
    unsafe {
        let open = (*platform.vfs).xOpen.expect("a VFS opens files");
        if flags & ffi::SQLITE_OPEN_WAL == 0 {
            return open(platform.vfs, name, file, flags, out_flags);
        }
        let inner = inner(file);
        let rc = open(platform.vfs, name, inner, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            // SQLite closes a file whose `pMethods` an open that failed left set: this layer's
            // is left unset, so the platform's object is closed here if it needs to be.
            if let Some(close) = methods(inner).and_then(|m| m.xClose) {
                close(inner);
            }
            (*file).pMethods = std::ptr::null();
            return rc;
        }
        std::ptr::write(
            file.cast::<WalFile>(),
            WalFile {
                base: ffi::sqlite3_file {
                    pMethods: &WAL_METHODS,
                },
                kept: Vec::new(),
                kept_at: 0,
                writes: WalWrites::default(),
            },
        );
        ffi::SQLITE_OK
    }
}

/// The platform's object inside a WAL file's.
///
/// # Safety
/// `file` is a file object of this VFS (`szOsFile` long).
unsafe fn inner(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY: the object is `inner_at` plus the platform's `szOsFile` long (`register`).
    unsafe { file.cast::<u8>().add(platform().inner_at).cast() }
}

/// # Safety
/// `file` is a platform file object.
unsafe fn methods(file: *mut ffi::sqlite3_file) -> Option<&'static ffi::sqlite3_io_methods> {
    // SAFETY: a platform file object's methods are a static of the platform's, or null.
    unsafe { (*file).pMethods.as_ref() }
}

/// The layer's fields of a WAL file object, and its platform object with its methods.
///
/// # Safety
/// `file` is a WAL file this layer opened and has not closed, used by one thread at a time
/// (SQLite's connection owns it).
unsafe fn parts<'a>(
    file: *mut ffi::sqlite3_file,
) -> (
    &'a mut WalFile,
    *mut ffi::sqlite3_file,
    &'static ffi::sqlite3_io_methods,
) {
    // SAFETY: `open` wrote a `WalFile` at the start of the object and opened the platform's
    // object after it.
    unsafe {
        let inner = inner(file);
        let methods = methods(inner).expect("an open file has its methods");
        (&mut *file.cast::<WalFile>(), inner, methods)
    }
}

/// Writes what is kept to the file, in one write. What a failed write kept stays kept, to be
/// written before anything after it: it is never dropped unwritten while the file is open, even
/// where SQLite would not look at the error (a file control it sends as a hint), so a later
/// sync that succeeds has written it.
///
/// # Safety
/// As [`parts`].
unsafe fn flush(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as the caller's.
    let (wal, inner, methods) = unsafe { parts(file) };
    if wal.kept.is_empty() {
        return ffi::SQLITE_OK;
    }
    let Ok(len) = c_int::try_from(wal.kept.len()) else {
        unreachable!("at most MAX_KEPT bytes are kept")
    };
    let write = methods.xWrite.expect("a file is written");
    wal.writes.made += 1;
    // SAFETY: the platform object is open; `kept` is `len` bytes long.
    let rc = unsafe { write(inner, wal.kept.as_ptr().cast(), len, wal.kept_at) };
    if rc == ffi::SQLITE_OK {
        wal.kept.clear();
    }
    rc
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let Ok(len) = usize::try_from(amount) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    // SAFETY: SQLite calls a file's methods on the file it opened, one thread at a time, and
    // hands `amount` bytes at `data`.
    unsafe {
        let (wal, ..) = parts(file);
        wal.writes.asked += 1;
        let follows = offset == wal.kept_at + wal.kept.len() as i64;
        if !(follows && wal.kept.len() + len <= MAX_KEPT) {
            let rc = flush(file);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        let (wal, inner, methods) = parts(file);
        if len > MAX_KEPT {
            wal.writes.made += 1;
            let write = methods.xWrite.expect("a file is written");
            return write(inner, data, amount, offset);
        }
        if wal.kept.is_empty() {
            wal.kept_at = offset;
        }
        wal.kept
            .extend_from_slice(std::slice::from_raw_parts(data.cast::<u8>(), len));
        ffi::SQLITE_OK
    }
}

/// Defines a method that writes what is kept, then asks the platform's object.
macro_rules! after_flush {
    ($name:ident, $method:ident ( $($arg:ident : $ty:ty),* )) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $ty),*) -> c_int {
            // SAFETY: SQLite calls a file's methods on the file it opened, one thread at a time.
            unsafe {
                let rc = flush(file);
                if rc != ffi::SQLITE_OK {
                    return rc;
                }
                let (_, inner, methods) = parts(file);
                let method = methods.$method.expect("the platform's file has the method");
                method(inner, $($arg),*)
            }
        }
    };
}

after_flush!(read, xRead(data: *mut c_void, amount: c_int, offset: i64));
after_flush!(truncate, xTruncate(size: i64));
after_flush!(sync, xSync(flags: c_int));
after_flush!(file_size, xFileSize(size: *mut i64));
after_flush!(lock, xLock(level: c_int));
after_flush!(unlock, xUnlock(level: c_int));
after_flush!(check_reserved_lock, xCheckReservedLock(out: *mut c_int));
after_flush!(file_control, xFileControl(op: c_int, arg: *mut c_void));

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as `after_flush!`'s methods; the question changes nothing in the file.
    unsafe {
        let (_, inner, methods) = parts(file);
        methods.xSectorSize.map_or(0, |method| method(inner))
    }
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as `sector_size`.
    unsafe {
        let (_, inner, methods) = parts(file);
        methods
            .xDeviceCharacteristics
            .map_or(0, |method| method(inner))
    }
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes a file once, after its last use; the `WalFile` written by `open` is
    // dropped here and never read again.
    unsafe {
        let flushed = flush(file);
        let (_, inner, methods) = parts(file);
        let closed = methods.xClose.map_or(ffi::SQLITE_OK, |close| close(inner));
        std::ptr::drop_in_place(file.cast::<WalFile>());
        (*file).pMethods = std::ptr::null();
        if flushed != ffi::SQLITE_OK {
            flushed
        } else {
            closed
        }
    }
}
