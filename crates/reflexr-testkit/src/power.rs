//! A test-only SQLite VFS that simulates a power cut (the disk model of
//! `tests/it/power.rs`). It wraps the default VFS and keeps, per file, the
//! writes made since that file's last sync in memory — the operating
//! system's page cache — while the file on disk holds only what was synced:
//! what a disk holds after the power goes.
//!
//! What it models:
//! - a write is durable only once its file is synced (`xSync`); reads see
//!   every write (the cache);
//! - at a cut, each 512-byte sector written since the last sync of its file
//!   independently survives (its latest content), is lost (the synced
//!   content stays), or is torn (5%: only a leading part of its new bytes
//!   reached the platter) — in any order, as a disk flushes its cache; how
//!   much of a file's cache got out (none, half, most or all of it) is drawn
//!   per file, so one file may keep writes that another, written before
//!   them, lost;
//! - a pending truncation survives or not;
//! - a file created in this run and never synced may be missing altogether
//!   (its directory entry was never made durable).
//!
//! What it does not model: the order of directory operations other than a
//! never-synced creation (a deleted file stays deleted); damage to sectors
//! that were synced (a disk that lies about flushing); the shared-memory
//! index (`-shm`), which SQLite rebuilds from the WAL after a crash — the
//! test removes it after each cut ([`forget_shared_memory`]); memory-mapped
//! I/O (this VFS offers no `xFetch`).
//!
//! Every I/O of tracked files goes through one lock, so the cut — which
//! takes that lock, writes the surviving sectors, and ends the process
//! without letting it go — happens between two I/O calls, as a power cut
//! happens between two disk commands.

#![allow(unsafe_code, clippy::missing_safety_doc)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::io::{Seek, SeekFrom, Write};
use std::sync::{Mutex, MutexGuard, OnceLock};

use reflexr::rusqlite::ffi;

/// The name the VFS is registered under.
pub const NAME: &str = "reflexr-power";

const SECTOR: u64 = 512;

/// A file's writes since its last sync.
#[derive(Default)]
struct Pending {
    /// Sector number → its latest content (512 bytes).
    sectors: BTreeMap<u64, Vec<u8>>,
    /// The size the file has for its readers.
    size: u64,
    /// The smallest size a truncation not yet synced left (the disk's
    /// bytes from there on read as zeros, as the truncation made them).
    truncated_to: Option<u64>,
    /// Created in this run and never synced: its directory entry may not
    /// survive.
    unsynced_new: bool,
}

/// Every tracked file's cache.
pub struct State {
    files: HashMap<String, Pending>,
}

fn state() -> MutexGuard<'static, State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            Mutex::new(State {
                files: HashMap::new(),
            })
        })
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Our file: SQLite's header, then the default VFS's file, which does the
/// I/O, and the name of the file (None: not tracked, e.g. a temp file).
#[repr(C)]
struct PowerFile {
    base: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    path: *mut c_char,
}

fn default_vfs() -> *mut ffi::sqlite3_vfs {
    unsafe { ffi::sqlite3_vfs_find(std::ptr::null()) }
}

/// Registers the VFS (once; later calls do nothing).
pub fn register() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| unsafe {
        let inner = &*default_vfs();
        let name = CString::new(NAME).unwrap().into_raw();
        let vfs = Box::new(ffi::sqlite3_vfs {
            iVersion: 2,
            szOsFile: std::mem::size_of::<PowerFile>() as c_int,
            mxPathname: inner.mxPathname,
            pNext: std::ptr::null_mut(),
            zName: name,
            pAppData: std::ptr::null_mut(),
            xOpen: Some(v_open),
            xDelete: Some(v_delete),
            xAccess: Some(v_access),
            xFullPathname: Some(v_full_pathname),
            xDlOpen: None,
            xDlError: None,
            xDlSym: None,
            xDlClose: None,
            xRandomness: Some(v_randomness),
            xSleep: Some(v_sleep),
            xCurrentTime: Some(v_current_time),
            xGetLastError: Some(v_get_last_error),
            xCurrentTimeInt64: Some(v_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        });
        let rc = ffi::sqlite3_vfs_register(Box::into_raw(vfs), 0);
        assert_eq!(rc, ffi::SQLITE_OK, "registering the power-cut VFS");
    });
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 2,
    xClose: Some(f_close),
    xRead: Some(f_read),
    xWrite: Some(f_write),
    xTruncate: Some(f_truncate),
    xSync: Some(f_sync),
    xFileSize: Some(f_file_size),
    xLock: Some(f_lock),
    xUnlock: Some(f_unlock),
    xCheckReservedLock: Some(f_check_reserved_lock),
    xFileControl: Some(f_file_control),
    xSectorSize: Some(f_sector_size),
    xDeviceCharacteristics: Some(f_device_characteristics),
    xShmMap: Some(f_shm_map),
    xShmLock: Some(f_shm_lock),
    xShmBarrier: Some(f_shm_barrier),
    xShmUnmap: Some(f_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

unsafe fn inner_methods(f: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    unsafe { &*(*f).pMethods }
}

unsafe fn parts(f: *mut ffi::sqlite3_file) -> (*mut ffi::sqlite3_file, Option<String>) {
    unsafe {
        let p = f as *mut PowerFile;
        let path = if (*p).path.is_null() {
            None
        } else {
            Some(CStr::from_ptr((*p).path).to_string_lossy().into_owned())
        };
        ((*p).inner, path)
    }
}

unsafe extern "C" fn v_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    unsafe {
        let d = &*default_vfs();
        let layout = std::alloc::Layout::from_size_align(d.szOsFile as usize, 16).unwrap();
        let inner = std::alloc::alloc_zeroed(layout) as *mut ffi::sqlite3_file;
        let p = file as *mut PowerFile;
        (*p).base.pMethods = std::ptr::null();
        let tracked = !name.is_null()
            && flags
                & (ffi::SQLITE_OPEN_MAIN_DB | ffi::SQLITE_OPEN_WAL | ffi::SQLITE_OPEN_MAIN_JOURNAL)
                != 0;
        let path_str =
            (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned());
        // Held from the existence check to the registration, so two
        // connections opening a new file at once agree it is new (and a cut
        // cannot fall between).
        let mut st = state();
        let existed = path_str
            .as_deref()
            .is_some_and(|p| std::path::Path::new(p).exists());
        let rc = (d.xOpen.unwrap())(default_vfs(), name, inner, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            std::alloc::dealloc(inner as *mut u8, layout);
            return rc;
        }
        (*p).inner = inner;
        (*p).path = if tracked {
            CString::new(path_str.clone().unwrap()).unwrap().into_raw()
        } else {
            std::ptr::null_mut()
        };
        if tracked {
            let path = path_str.unwrap();
            let mut size: ffi::sqlite3_int64 = 0;
            (inner_methods(inner).xFileSize.unwrap())(inner, &mut size);
            let entry = st.files.entry(path).or_insert_with(|| Pending {
                size: size as u64,
                unsynced_new: !existed,
                ..Pending::default()
            });
            let _ = entry;
        }
        (*p).base.pMethods = &METHODS;
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn v_delete(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    unsafe {
        let mut st = state();
        let path = CStr::from_ptr(name).to_string_lossy().into_owned();
        st.files.remove(&path);
        let d = &*default_vfs();
        (d.xDelete.unwrap())(default_vfs(), name, sync_dir)
    }
}

unsafe extern "C" fn v_access(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    unsafe {
        // Whether a tracked file exists is what its readers see (the cache),
        // as the default VFS answers it: present and not empty.
        if flags == ffi::SQLITE_ACCESS_EXISTS {
            let path = CStr::from_ptr(name).to_string_lossy();
            if let Some(p) = state().files.get(path.as_ref()) {
                *out = c_int::from(p.size > 0);
                return ffi::SQLITE_OK;
            }
        }
        ((*default_vfs()).xAccess.unwrap())(default_vfs(), name, flags, out)
    }
}

unsafe extern "C" fn v_full_pathname(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    unsafe { ((*default_vfs()).xFullPathname.unwrap())(default_vfs(), name, n, out) }
}

unsafe extern "C" fn v_randomness(
    _vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    unsafe { ((*default_vfs()).xRandomness.unwrap())(default_vfs(), n, out) }
}

unsafe extern "C" fn v_sleep(_vfs: *mut ffi::sqlite3_vfs, us: c_int) -> c_int {
    unsafe { ((*default_vfs()).xSleep.unwrap())(default_vfs(), us) }
}

unsafe extern "C" fn v_current_time(_vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    unsafe { ((*default_vfs()).xCurrentTime.unwrap())(default_vfs(), out) }
}

unsafe extern "C" fn v_get_last_error(
    _vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    unsafe { ((*default_vfs()).xGetLastError.unwrap())(default_vfs(), n, out) }
}

unsafe extern "C" fn v_current_time_int64(
    _vfs: *mut ffi::sqlite3_vfs,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    unsafe { ((*default_vfs()).xCurrentTimeInt64.unwrap())(default_vfs(), out) }
}

unsafe extern "C" fn f_close(f: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let p = f as *mut PowerFile;
        let inner = (*p).inner;
        let rc = (inner_methods(inner).xClose.unwrap())(inner);
        let d = &*default_vfs();
        let layout = std::alloc::Layout::from_size_align(d.szOsFile as usize, 16).unwrap();
        std::alloc::dealloc(inner as *mut u8, layout);
        if !(*p).path.is_null() {
            drop(CString::from_raw((*p).path));
            (*p).path = std::ptr::null_mut();
        }
        rc
    }
}

/// Reads what the disk holds (through the inner file), short reads zeroed,
/// and bytes at or past a pending truncation's size zeroed too (the
/// truncation removed them for the file's readers).
unsafe fn read_durable(inner: *mut ffi::sqlite3_file, buf: &mut [u8], off: u64, p: &Pending) {
    unsafe {
        buf.fill(0);
        let rc = (inner_methods(inner).xRead.unwrap())(
            inner,
            buf.as_mut_ptr() as *mut c_void,
            buf.len() as c_int,
            off as ffi::sqlite3_int64,
        );
        let _ = rc; // SQLITE_IOERR_SHORT_READ leaves zeros: what a hole reads as
        if let Some(t) = p.truncated_to {
            let keep = t.saturating_sub(off).min(buf.len() as u64) as usize;
            buf[keep..].fill(0);
        }
    }
}

unsafe extern "C" fn f_read(
    f: *mut ffi::sqlite3_file,
    out: *mut c_void,
    amt: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    unsafe {
        let (inner, path) = parts(f);
        let Some(path) = path else {
            return (inner_methods(inner).xRead.unwrap())(inner, out, amt, off);
        };
        let st = state();
        let p = &st.files[&path];
        let buf = std::slice::from_raw_parts_mut(out as *mut u8, amt as usize);
        let off = off as u64;
        read_durable(inner, buf, off, p);
        // The cache's newer sectors over the disk's.
        let first = off / SECTOR;
        let last = (off + amt as u64).div_ceil(SECTOR);
        for (n, data) in p.sectors.range(first..last) {
            let s_off = n * SECTOR;
            let from = off.max(s_off);
            let to = (off + amt as u64).min(s_off + SECTOR);
            buf[(from - off) as usize..(to - off) as usize]
                .copy_from_slice(&data[(from - s_off) as usize..(to - s_off) as usize]);
        }
        // Past the readers' size: zeros (and a short read).
        let end = p.size.saturating_sub(off).min(amt as u64) as usize;
        buf[end..].fill(0);
        if off + amt as u64 > p.size {
            ffi::SQLITE_IOERR_SHORT_READ
        } else {
            ffi::SQLITE_OK
        }
    }
}

unsafe extern "C" fn f_write(
    f: *mut ffi::sqlite3_file,
    data: *const c_void,
    amt: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    unsafe {
        let (inner, path) = parts(f);
        let Some(path) = path else {
            return (inner_methods(inner).xWrite.unwrap())(inner, data, amt, off);
        };
        let mut st = state();
        let size = st.files[&path].size;
        let truncated_to = st.files[&path].truncated_to;
        let src = std::slice::from_raw_parts(data as *const u8, amt as usize);
        let off = off as u64;
        let end = off + amt as u64;
        let mut n = off / SECTOR;
        while n * SECTOR < end {
            let s_off = n * SECTOR;
            let mut sector = match st.files[&path].sectors.get(&n) {
                Some(s) => s.clone(),
                None => {
                    let mut s = vec![0u8; SECTOR as usize];
                    if s_off < size {
                        let view = Pending {
                            truncated_to,
                            ..Pending::default()
                        };
                        read_durable(inner, &mut s, s_off, &view);
                    }
                    // Bytes past the readers' size are zeros, whatever the
                    // disk still holds there.
                    if size < s_off + SECTOR {
                        let keep = size.saturating_sub(s_off) as usize;
                        s[keep..].fill(0);
                    }
                    s
                }
            };
            let from = off.max(s_off);
            let to = end.min(s_off + SECTOR);
            sector[(from - s_off) as usize..(to - s_off) as usize]
                .copy_from_slice(&src[(from - off) as usize..(to - off) as usize]);
            st.files.get_mut(&path).unwrap().sectors.insert(n, sector);
            n += 1;
        }
        let p = st.files.get_mut(&path).unwrap();
        p.size = p.size.max(end);
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn f_truncate(f: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    unsafe {
        let (inner, path) = parts(f);
        let Some(path) = path else {
            return (inner_methods(inner).xTruncate.unwrap())(inner, size);
        };
        let mut st = state();
        let p = st.files.get_mut(&path).unwrap();
        let size = size as u64;
        p.size = size;
        p.truncated_to = Some(p.truncated_to.map_or(size, |t| t.min(size)));
        let keep = size.div_ceil(SECTOR);
        p.sectors.retain(|n, _| *n < keep);
        if let Some(last) = p.sectors.get_mut(&(size / SECTOR))
            && !size.is_multiple_of(SECTOR)
        {
            last[(size % SECTOR) as usize..].fill(0);
        }
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn f_sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    unsafe {
        let (inner, path) = parts(f);
        let m = inner_methods(inner);
        let Some(path) = path else {
            return (m.xSync.unwrap())(inner, flags);
        };
        let mut st = state();
        let p = st.files.get_mut(&path).unwrap();
        // The cache reaches the disk: the truncation (to the smallest size
        // it had, then out to the size it has now, zeros between), then every
        // sector (the last one cut to the file's size), then the disk's own
        // flush.
        let size = p.size;
        for to in p.truncated_to.into_iter().chain([size]) {
            let rc = (m.xTruncate.unwrap())(inner, to as ffi::sqlite3_int64);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        for (n, data) in &p.sectors {
            let s_off = n * SECTOR;
            if s_off >= size {
                continue;
            }
            let len = (size - s_off).min(SECTOR) as usize;
            let rc = (m.xWrite.unwrap())(
                inner,
                data.as_ptr() as *const c_void,
                len as c_int,
                s_off as ffi::sqlite3_int64,
            );
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        let rc = (m.xSync.unwrap())(inner, flags);
        if rc == ffi::SQLITE_OK {
            p.sectors.clear();
            p.truncated_to = None;
            p.unsynced_new = false;
        }
        rc
    }
}

unsafe extern "C" fn f_file_size(f: *mut ffi::sqlite3_file, out: *mut ffi::sqlite3_int64) -> c_int {
    unsafe {
        let (inner, path) = parts(f);
        let Some(path) = path else {
            return (inner_methods(inner).xFileSize.unwrap())(inner, out);
        };
        *out = state().files[&path].size as ffi::sqlite3_int64;
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn f_lock(f: *mut ffi::sqlite3_file, l: c_int) -> c_int {
    unsafe {
        let inner = (*(f as *mut PowerFile)).inner;
        (inner_methods(inner).xLock.unwrap())(inner, l)
    }
}

unsafe extern "C" fn f_unlock(f: *mut ffi::sqlite3_file, l: c_int) -> c_int {
    unsafe {
        let inner = (*(f as *mut PowerFile)).inner;
        (inner_methods(inner).xUnlock.unwrap())(inner, l)
    }
}

unsafe extern "C" fn f_check_reserved_lock(f: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    unsafe {
        let inner = (*(f as *mut PowerFile)).inner;
        (inner_methods(inner).xCheckReservedLock.unwrap())(inner, out)
    }
}

unsafe extern "C" fn f_file_control(
    f: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    unsafe {
        let inner = (*(f as *mut PowerFile)).inner;
        // Size hints would grow the file on disk behind the cache's back:
        // not passed on (SQLite treats them as advice).
        if op == ffi::SQLITE_FCNTL_SIZE_HINT || op == ffi::SQLITE_FCNTL_CHUNK_SIZE {
            return ffi::SQLITE_OK;
        }
        (inner_methods(inner).xFileControl.unwrap())(inner, op, arg)
    }
}

unsafe extern "C" fn f_sector_size(f: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let inner = (*(f as *mut PowerFile)).inner;
        (inner_methods(inner).xSectorSize.unwrap())(inner)
    }
}

unsafe extern "C" fn f_device_characteristics(f: *mut ffi::sqlite3_file) -> c_int {
    // What the model gives, so SQLite takes the path it takes on the default
    // VFS: power-safe overwrite (a torn or lost sector never changes bytes
    // outside what was written: a pending sector carries the disk's own
    // bytes around the write) if the default VFS says so; no atomic or
    // safe-append writes.
    unsafe {
        let inner = (*(f as *mut PowerFile)).inner;
        (inner_methods(inner).xDeviceCharacteristics.unwrap())(inner)
            & ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE
    }
}

unsafe extern "C" fn f_shm_map(
    f: *mut ffi::sqlite3_file,
    pg: c_int,
    sz: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    unsafe {
        let inner = (*(f as *mut PowerFile)).inner;
        (inner_methods(inner).xShmMap.unwrap())(inner, pg, sz, extend, out)
    }
}

unsafe extern "C" fn f_shm_lock(
    f: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    unsafe {
        let inner = (*(f as *mut PowerFile)).inner;
        (inner_methods(inner).xShmLock.unwrap())(inner, offset, n, flags)
    }
}

unsafe extern "C" fn f_shm_barrier(f: *mut ffi::sqlite3_file) {
    unsafe {
        let inner = (*(f as *mut PowerFile)).inner;
        (inner_methods(inner).xShmBarrier.unwrap())(inner)
    }
}

unsafe extern "C" fn f_shm_unmap(f: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    unsafe {
        let inner = (*(f as *mut PowerFile)).inner;
        (inner_methods(inner).xShmUnmap.unwrap())(inner, delete)
    }
}

/// What a cut did to the files, for the record.
#[derive(Debug, Default)]
pub struct Cut {
    pub survived: usize,
    pub lost: usize,
    pub torn: usize,
    pub files_lost: usize,
}

/// The power goes: every file keeps what was synced, and each sector
/// written since (and each pending truncation, and each never-synced new
/// file) survives, is lost or is torn at random. Returns while still holding
/// the lock, so no I/O of this process follows; the caller ends the process.
pub fn cut() -> (Cut, MutexGuard<'static, State>) {
    let st = state();
    let mut report = Cut::default();
    for (path, p) in &st.files {
        if p.unsynced_new && fastrand::bool() {
            let _ = std::fs::remove_file(path);
            report.files_lost += 1;
            continue;
        }
        let Ok(mut file) = std::fs::OpenOptions::new().write(true).open(path) else {
            continue;
        };
        if let Some(t) = p.truncated_to
            && fastrand::bool()
        {
            let _ = file.set_len(t);
        }
        // The disk flushes its cache in any order, a sector at a time, and
        // had got through some of it when the power went: how much differs
        // from file to file (none, half, most, all), so one file may keep
        // what another written after it lost.
        let keep = [0, 50, 90, 100][fastrand::usize(..4)];
        let mut sectors: Vec<(&u64, &Vec<u8>)> = p.sectors.iter().collect();
        fastrand::shuffle(&mut sectors);
        for (n, data) in sectors {
            let s_off = n * SECTOR;
            let len = p.size.saturating_sub(s_off).min(SECTOR) as usize;
            if fastrand::u8(..100) < 5 {
                // Torn: only a leading part of the new bytes got there.
                let part = fastrand::usize(..len.max(1));
                let _ = file.seek(SeekFrom::Start(s_off));
                let _ = file.write_all(&data[..part]);
                report.torn += 1;
            } else if fastrand::u8(..100) < keep {
                let _ = file.seek(SeekFrom::Start(s_off));
                let _ = file.write_all(&data[..len]);
                report.survived += 1;
            } else {
                report.lost += 1;
            }
        }
        let _ = file.sync_all();
    }
    (report, st)
}

/// The `-shm` beside `db`: after a power cut it is gone (it lives in memory
/// on many systems, and SQLite rebuilds it from the WAL).
pub fn forget_shared_memory(db: &std::path::Path) {
    let mut shm = db.as_os_str().to_os_string();
    shm.push("-shm");
    let _ = std::fs::remove_file(shm);
}
