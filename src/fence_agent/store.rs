//! The local key store fence_scsi keeps, so that `on` remembers this node's key and the devices
//! it registered on, a later `off` on this node preempts with that key, and fence_scsi's
//! watchdog helper (`fence_scsi_check`) keeps working after the switch to fence_pr.
//!
//! Facts (fence_scsi 4.12.1 and fence-agents HEAD): the files are `<stem>.key` and `<stem>.dev`
//! with stem `STORE_PATH` = `${localstatedir}/run/cluster` since commit c2c72887 (2021), i.e.
//! `/var/run/cluster.key` and `/var/run/cluster.dev`; older releases used the stem
//! `/var/run/cluster/fence_scsi`. The default store still reads the key from there when
//! `/var/run/cluster.key` is absent: a node whose last `on` was such a release's fence_scsi
//! (`/run` is usually a tmpfs, so that key is from this boot). `.key` holds one line, the key
//! in lowercase hex without `0x` or leading zeros, rewritten by every `on`; readers take the
//! first line, trimmed and lowercased. `.dev` holds one device path per line as given in
//! `devices`, appended by `on` when no line starts with that path followed by whitespace;
//! readers take the non-empty trimmed lines. The parent directory is created when missing.
//! fence_pr adds `<stem>.lus` (fence_scsi neither writes nor reads it): the LUs, by identifier,
//! that `on` or `prfence unfence` began registering the key on, so a later `on` in the same boot
//! can tell that this node was fenced since ([`KeyStore::lus_path`]).
//!
//! Both files are replaced whole through [`crate::atomic_file::write_atomic`] (unique temporary,
//! no symlink followed, fsync, rename); `.dev` and `.lus` are read, checked and rewritten under an
//! exclusive `flock` on `<stem>.dev.lock`, so two `on` runs never lose each other's lines. fence_scsi
//! itself appends without a lock; it and fence_pr do not run `on` at the same time on one node.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg, OFlag};

use crate::atomic_file::{MODE_DEFAULT, write_atomic};

use crate::discover::LuId;
use crate::keys::{self, KeyError};
use crate::ops::BootRecord;

/// Stem of the store used by fence_scsi since fence-agents c2c72887 (4.12.1, HEAD).
pub const DEFAULT_STEM: &str = "/var/run/cluster";
/// Stem used by fence_scsi before c2c72887 (RHEL 7/8 era releases).
pub const LEGACY_STEM: &str = "/var/run/cluster/fence_scsi";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Any failure but a missing file (each reader treats absence itself).
    #[error(
        "Failed: Cannot open file \"{path}\": {source}; it exists but cannot be read: check its \
         type and permissions (Pacemaker runs fence_pr as root)"
    )]
    Io { path: PathBuf, source: io::Error },
    #[error("Failed: Cannot write file \"{path}\": {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error(
        "Failed: key file \"{path}\" is not UTF-8 text (corrupt, or not written by fence_pr or \
         fence_scsi); remove it and run `fence_pr -o on` on this node again"
    )]
    NotUtf8 { path: PathBuf },
    #[error(
        "Failed: key file \"{path}\" holds {line:?}, not a hex key ({source}); remove it and run \
         `fence_pr -o on` on this node again"
    )]
    BadKey {
        path: PathBuf,
        line: String,
        source: KeyError,
    },
}

/// The `.key`/`.dev` pair under one stem, and optionally an older stem whose `.key` is read
/// when this one has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyStore {
    stem: PathBuf,
    legacy: Option<PathBuf>,
}

impl Default for KeyStore {
    /// fence_scsi's store, falling back to the pre-2021 one for reading the key.
    fn default() -> Self {
        KeyStore::new(DEFAULT_STEM).with_legacy(LEGACY_STEM)
    }
}

/// Environment variable naming the key store stem instead of `/var/run/cluster`. Not a fence_scsi
/// option: it lets a lab run two "nodes" on one host, each with its own store.
pub const STORE_ENV: &str = "FENCE_PR_STORE";

impl KeyStore {
    /// The node's store: fence_scsi's (`/var/run/cluster.key`/`.dev`, the key also read from
    /// `/var/run/cluster/fence_scsi.key` when that is absent) unless [`STORE_ENV`] names another
    /// stem. fence_pr and `prfence unfence` share it.
    pub fn from_environment() -> KeyStore {
        std::env::var_os(STORE_ENV)
            .filter(|s| !s.is_empty())
            .map_or_else(KeyStore::default, KeyStore::new)
    }

    /// A store whose files are `<stem>.key` and `<stem>.dev`.
    pub fn new(stem: impl Into<PathBuf>) -> KeyStore {
        KeyStore {
            stem: stem.into(),
            legacy: None,
        }
    }

    /// Also reads the key from `<legacy>.key` when `<stem>.key` does not exist. Writes always go
    /// to `<stem>`.
    pub fn with_legacy(self, legacy: impl Into<PathBuf>) -> KeyStore {
        KeyStore {
            legacy: Some(legacy.into()),
            ..self
        }
    }

    pub fn key_path(&self) -> PathBuf {
        self.with_suffix(".key")
    }

    /// `<legacy>.key`, if this store has a legacy stem.
    pub fn legacy_key_path(&self) -> Option<PathBuf> {
        self.legacy.as_ref().map(|legacy| {
            let mut path = legacy.clone().into_os_string();
            path.push(".key");
            PathBuf::from(path)
        })
    }

    pub fn dev_path(&self) -> PathBuf {
        self.with_suffix(".dev")
    }

    fn with_suffix(&self, suffix: &str) -> PathBuf {
        let mut path = self.stem.clone().into_os_string();
        path.push(suffix);
        PathBuf::from(path)
    }

    fn io_error(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
        move |source| StoreError::Io {
            path: path.to_owned(),
            source,
        }
    }

    fn ensure_parent(path: &Path) -> Result<(), StoreError> {
        match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => {
                fs::create_dir_all(parent).map_err(Self::write_error(parent))
            }
            _ => Ok(()),
        }
    }

    fn write_error(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
        move |source| StoreError::Write {
            path: path.to_owned(),
            source,
        }
    }

    /// Records this node's key (`on`), atomically, so a concurrent reader (the watchdog check)
    /// never sees an empty file.
    pub fn write_key(&self, key: u64) -> Result<(), StoreError> {
        let path = self.key_path();
        Self::ensure_parent(&path)?;
        let text = format!("{}\n", keys::fence_scsi_key_text(key));
        write_atomic(&path, text.as_bytes(), MODE_DEFAULT).map_err(Self::write_error(&path))
    }

    /// This node's key as recorded by `on` (of fence_pr or fence_scsi): from `<stem>.key`, or
    /// when that does not exist from the legacy stem's; `None` if neither exists.
    pub fn read_key(&self) -> Result<Option<u64>, StoreError> {
        if let Some(key) = Self::read_key_at(self.key_path())? {
            return Ok(Some(key));
        }
        let Some(legacy) = self.legacy_key_path() else {
            return Ok(None);
        };
        let key = Self::read_key_at(legacy.clone())?;
        if key.is_some() {
            tracing::info!(
                path = %legacy.display(),
                "key read from the store of fence-agents before 2021"
            );
        }
        Ok(key)
    }

    fn read_key_at(path: PathBuf) -> Result<Option<u64>, StoreError> {
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Self::io_error(&path)(e)),
        };
        let Ok(text) = String::from_utf8(bytes) else {
            return Err(StoreError::NotUtf8 { path });
        };
        let line = text
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        keys::parse_key(&line)
            .map(Some)
            .map_err(|source| StoreError::BadKey { path, line, source })
    }

    /// The lock serializing `.dev` and `.lus` updates: `<stem>.dev.lock`, never through a
    /// symlink.
    fn lock_devices(&self) -> Result<Flock<fs::File>, StoreError> {
        let path = self.with_suffix(".dev.lock");
        let file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(OFlag::O_NOFOLLOW.bits() | OFlag::O_CLOEXEC.bits())
            .open(&path)
            .map_err(Self::write_error(&path))?;
        Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| Self::write_error(&path)(io::Error::from(errno)))
    }

    /// Records the devices registered by `on`, those not listed yet, in one rewrite.
    pub fn add_devices<'a>(
        &self,
        devices: impl IntoIterator<Item = &'a Path>,
    ) -> Result<(), StoreError> {
        // fence_scsi's test is a line starting with the path followed by whitespace; a last line
        // without its newline counts here too (fence_scsi would glue the next path onto it).
        self.add_lines(
            &self.dev_path(),
            devices
                .into_iter()
                .map(|d| d.as_os_str().as_encoded_bytes()),
            |line, dev| {
                line.strip_prefix(dev)
                    .is_some_and(|rest| rest.first().is_none_or(u8::is_ascii_whitespace))
            },
        )
    }

    /// Appends each of `new` to the file at `path` unless a line matches it (`listed(line,
    /// new)`), in one rewrite. The read, the checks and the atomic rewrite happen under
    /// [`Self::lock_devices`].
    fn add_lines<'n>(
        &self,
        path: &Path,
        new: impl IntoIterator<Item = &'n [u8]>,
        listed: impl Fn(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        Self::ensure_parent(path)?;
        let _lock = self.lock_devices()?;
        let mut updated = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(Self::io_error(path)(e)),
        };
        let mut changed = false;
        for new in new {
            if updated.split(|&b| b == b'\n').any(|line| listed(line, new)) {
                continue;
            }
            // Keep the file line-structured even if an earlier writer left no final newline.
            if updated.last().is_some_and(|&b| b != b'\n') {
                updated.push(b'\n');
            }
            updated.extend_from_slice(new);
            updated.push(b'\n');
            changed = true;
        }
        if !changed {
            return Ok(());
        }
        write_atomic(path, &updated, MODE_DEFAULT).map_err(Self::write_error(path))
    }

    /// `<stem>.lus`: fence_pr's own record (fence_scsi has none) of the LUs `on` or `prfence
    /// unfence` began registering `key` on, one `<key> <LU identifier>` a line, each written
    /// before the LU's first REGISTER.
    /// On /run, a tmpfs, it lasts one boot, which is what `on`'s refusal to register a key
    /// preempted since needs (P3, [`BootRecord`]).
    pub fn lus_path(&self) -> PathBuf {
        self.with_suffix(".lus")
    }

    /// Records that `on` begins registering `key` on each of the LUs `lus` (their identifiers),
    /// those not listed yet, in one rewrite.
    pub fn add_lus<'a>(
        &self,
        key: u64,
        lus: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), StoreError> {
        let lines: Vec<String> = lus.into_iter().map(|lu| format!("{key:x} {lu}")).collect();
        self.add_lines(
            &self.lus_path(),
            lines.iter().map(String::as_bytes),
            |line, new| line.trim_ascii() == new,
        )
    }

    /// The identifiers of the LUs `on` began registering `key` on (none if the file does not
    /// exist).
    pub fn read_lus(&self, key: u64) -> Result<Vec<String>, StoreError> {
        let path = self.lus_path();
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Self::io_error(&path)(e)),
        };
        let key = format!("{key:x}");
        Ok(text
            .lines()
            .filter_map(|l| l.trim().split_once(' '))
            .filter(|(k, _)| *k == key)
            .map(|(_, lu)| lu.trim().to_owned())
            .collect())
    }

    /// Devices recorded by `on`; `None` if the file does not exist.
    pub fn read_devices(&self) -> Result<Option<Vec<PathBuf>>, StoreError> {
        let path = self.dev_path();
        match fs::read_to_string(&path) {
            Ok(text) => Ok(Some(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(PathBuf::from)
                    .collect(),
            )),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Self::io_error(&path)(e)),
        }
    }
}

/// The `.lus` record of one key as the engine's [`BootRecord`]: read once when `on` starts, each
/// new LU written (under the lock, fsync, rename) before its first REGISTER.
pub struct LuRecord {
    store: KeyStore,
    key: u64,
    recorded: HashSet<String>,
}

impl LuRecord {
    pub fn load(store: &KeyStore, key: u64) -> Result<LuRecord, StoreError> {
        Ok(LuRecord {
            store: store.clone(),
            key,
            recorded: store.read_lus(key)?.into_iter().collect(),
        })
    }
}

impl BootRecord for LuRecord {
    fn contains(&self, lu: &LuId) -> bool {
        self.recorded.contains(lu.as_str())
    }

    fn add(&self, lu: &LuId) -> Result<(), String> {
        self.store.add_lus(self.key, [lu.as_str()]).map_err(|e| {
            format!(
                "{}; run it as root (where fence_pr does not run, {STORE_ENV} may name a stem \
                 this user can write)",
                e.to_string().trim_start_matches("Failed: ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_store(name: &str) -> (PathBuf, KeyStore) {
        let dir = std::env::temp_dir().join(format!("prfence-store-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let store = KeyStore::new(dir.join("run").join("cluster"));
        (dir, store)
    }

    #[test]
    fn default_paths_are_fence_scsis() {
        let store = KeyStore::default();
        assert_eq!(store.key_path(), Path::new("/var/run/cluster.key"));
        assert_eq!(store.dev_path(), Path::new("/var/run/cluster.dev"));
        assert_eq!(
            store.legacy_key_path().as_deref(),
            Some(Path::new("/var/run/cluster/fence_scsi.key"))
        );
        assert_eq!(KeyStore::new(DEFAULT_STEM).legacy_key_path(), None);
    }

    /// fence_scsi before c2c72887 kept the key in `<run>/cluster/fence_scsi.key`.
    fn with_legacy(dir: &Path, store: KeyStore) -> (PathBuf, KeyStore) {
        let legacy = dir.join("run").join("cluster").join("fence_scsi");
        let store = store.with_legacy(&legacy);
        fs::create_dir_all(dir.join("run").join("cluster")).unwrap();
        (legacy.with_extension("key"), store)
    }

    #[test]
    fn the_legacy_key_is_read_when_the_current_one_is_absent() {
        let (dir, store) = temp_store("legacy");
        let (legacy_key, store) = with_legacy(&dir, store);
        assert_eq!(store.read_key().unwrap(), None);
        fs::write(&legacy_key, "6c9d0001\n").unwrap();
        assert_eq!(store.read_key().unwrap(), Some(0x6c9d_0001));
        // A store without a legacy stem does not look there.
        assert_eq!(
            KeyStore::new(dir.join("run").join("cluster"))
                .read_key()
                .unwrap(),
            None
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_current_key_wins_and_writes_never_go_to_the_legacy_store() {
        let (dir, store) = temp_store("legacy-current");
        let (legacy_key, store) = with_legacy(&dir, store);
        fs::write(&legacy_key, "6c9d0001\n").unwrap();
        store.write_key(0x0abc_0002).unwrap();
        assert_eq!(store.read_key().unwrap(), Some(0x0abc_0002));
        assert_eq!(fs::read_to_string(&legacy_key).unwrap(), "6c9d0001\n");
        assert_eq!(fs::read_to_string(store.key_path()).unwrap(), "abc0002\n");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_bad_legacy_key_is_an_error_naming_its_file() {
        let (dir, store) = temp_store("legacy-bad");
        let (legacy_key, store) = with_legacy(&dir, store);
        fs::write(&legacy_key, "not a key\n").unwrap();
        let e = store.read_key().unwrap_err();
        assert!(
            matches!(&e, StoreError::BadKey { path, .. } if *path == legacy_key),
            "{e:?}"
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn key_round_trip_in_fence_scsi_format() {
        let (dir, store) = temp_store("key");
        assert_eq!(store.read_key().unwrap(), None);
        store.write_key(0x0abc_0001).unwrap();
        assert_eq!(fs::read_to_string(store.key_path()).unwrap(), "abc0001\n");
        assert_eq!(store.read_key().unwrap(), Some(0x0abc_0001));
        store.write_key(0x6c9d_0002).unwrap();
        assert_eq!(store.read_key().unwrap(), Some(0x6c9d_0002));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn reads_a_key_written_by_fence_scsi() {
        let (dir, store) = temp_store("fsk");
        fs::create_dir_all(store.key_path().parent().unwrap()).unwrap();
        fs::write(store.key_path(), "  6C9D0001 \nignored\n").unwrap();
        assert_eq!(store.read_key().unwrap(), Some(0x6c9d_0001));
        fs::write(store.key_path(), "\n").unwrap();
        assert!(matches!(store.read_key(), Err(StoreError::BadKey { .. })));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn devices_append_once() {
        let (dir, store) = temp_store("dev");
        assert_eq!(store.read_devices().unwrap(), None);
        store.add_devices([Path::new("/dev/sdb")]).unwrap();
        store
            .add_devices(["/dev/sdb", "/dev/sd", "/dev/sdc", "/dev/sd"].map(Path::new))
            .unwrap();
        assert_eq!(
            fs::read_to_string(store.dev_path()).unwrap(),
            "/dev/sdb\n/dev/sd\n/dev/sdc\n"
        );
        assert_eq!(
            store.read_devices().unwrap().unwrap(),
            vec![
                PathBuf::from("/dev/sdb"),
                PathBuf::from("/dev/sd"),
                PathBuf::from("/dev/sdc")
            ]
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn lus_are_recorded_once_per_key_and_read_for_one_key() {
        let (dir, store) = temp_store("lus");
        assert!(store.read_lus(0x6c9d0001).unwrap().is_empty());
        store
            .add_lus(0x6c9d0001, ["naa.6001405aa", "naa.6001405aa"])
            .unwrap();
        store
            .add_lus(0x6c9d0001, ["/dev/sdq", "naa.6001405aa"])
            .unwrap();
        store.add_lus(0x6c9d0002, ["naa.6001405aa"]).unwrap();
        assert_eq!(
            fs::read_to_string(store.lus_path()).unwrap(),
            "6c9d0001 naa.6001405aa\n6c9d0001 /dev/sdq\n6c9d0002 naa.6001405aa\n"
        );
        assert_eq!(
            store.read_lus(0x6c9d0001).unwrap(),
            ["naa.6001405aa", "/dev/sdq"]
        );
        assert_eq!(store.read_lus(0x6c9d0002).unwrap(), ["naa.6001405aa"]);
        assert!(store.read_lus(0x6c9d0003).unwrap().is_empty());
        // fence_scsi's files are untouched.
        assert!(!store.dev_path().exists() && !store.key_path().exists());
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_unreadable_record_is_an_error_naming_its_file() {
        let (dir, store) = temp_store("unreadable");
        fs::create_dir_all(store.lus_path()).unwrap();
        let text = store.read_lus(0x6c9d0001).unwrap_err().to_string();
        assert!(
            text.contains("cluster.lus") && text.contains("cannot be read"),
            "{text}"
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn devices_tolerate_missing_final_newline_and_blank_lines() {
        let (dir, store) = temp_store("dev2");
        fs::create_dir_all(store.dev_path().parent().unwrap()).unwrap();
        fs::write(store.dev_path(), "\n/dev/sdb\n\n/dev/sdc").unwrap();
        store.add_devices([Path::new("/dev/sdc")]).unwrap();
        store.add_devices([Path::new("/dev/sdd")]).unwrap();
        assert_eq!(
            fs::read_to_string(store.dev_path()).unwrap(),
            "\n/dev/sdb\n\n/dev/sdc\n/dev/sdd\n"
        );
        assert_eq!(
            store.read_devices().unwrap().unwrap(),
            vec![
                PathBuf::from("/dev/sdb"),
                PathBuf::from("/dev/sdc"),
                PathBuf::from("/dev/sdd")
            ]
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn non_utf8_and_garbage_keys_say_what_is_wrong_and_how_to_fix_it() {
        let (dir, store) = temp_store("bad");
        fs::create_dir_all(store.key_path().parent().unwrap()).unwrap();
        fs::write(store.key_path(), b"\xff\xfe6c9d\n").unwrap();
        let e = store.read_key().unwrap_err();
        assert!(matches!(e, StoreError::NotUtf8 { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("cluster.key") && text.contains("not UTF-8"),
            "{text}"
        );
        assert!(
            text.contains("remove it and run `fence_pr -o on`"),
            "{text}"
        );
        assert!(!text.contains("cannot be read"), "{text}");
        fs::write(store.key_path(), "not a key\n").unwrap();
        let text = store.read_key().unwrap_err().to_string();
        assert!(text.contains("not a hex key"), "{text}");
        assert!(
            text.contains("remove it and run `fence_pr -o on`"),
            "{text}"
        );
        assert!(!text.contains("cannot be read"), "{text}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn planted_temporary_symlink_is_left_alone() {
        use std::os::unix::fs::symlink;
        let (dir, store) = temp_store("symlink");
        let run = store.key_path().parent().unwrap().to_owned();
        fs::create_dir_all(&run).unwrap();
        let victim = dir.join("victim");
        fs::write(&victim, "untouched").unwrap();
        symlink(&victim, run.join("cluster.key.tmp")).unwrap();
        store.write_key(0x6c9d_0001).unwrap();
        store.add_devices([Path::new("/dev/sdb")]).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "untouched");
        assert_eq!(fs::read_to_string(store.key_path()).unwrap(), "6c9d0001\n");
        assert!(
            fs::symlink_metadata(run.join("cluster.key.tmp"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let mut names: Vec<_> = fs::read_dir(&run)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "cluster.dev",
                "cluster.dev.lock",
                "cluster.key",
                "cluster.key.tmp"
            ]
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn files_keep_the_mode_file_create_gives() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, store) = temp_store("mode");
        store.write_key(1).unwrap();
        store.add_devices([Path::new("/dev/sdb")]).unwrap();
        let reference = dir.join("reference");
        fs::File::create(&reference).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode();
        assert_eq!(mode(&store.key_path()), mode(&reference));
        assert_eq!(mode(&store.dev_path()), mode(&reference));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn concurrent_device_updates_are_not_lost() {
        let (dir, store) = temp_store("race");
        for round in 0..50 {
            let _ = fs::remove_file(store.dev_path());
            let threads: Vec<_> = ["/dev/sdb", "/dev/sdc"]
                .into_iter()
                .map(|dev| {
                    let store = store.clone();
                    std::thread::spawn(move || {
                        store
                            .add_devices([Path::new(&format!("{dev}{round}"))])
                            .unwrap()
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            let mut devices = store.read_devices().unwrap().unwrap();
            devices.sort();
            assert_eq!(
                devices,
                [
                    PathBuf::from(format!("/dev/sdb{round}")),
                    PathBuf::from(format!("/dev/sdc{round}"))
                ],
                "round {round}"
            );
        }
        fs::remove_dir_all(dir).unwrap();
    }
}
