//! The status file (`--status-file`): the [`Status`] as JSON, rewritten after every check and
//! every self-fence step.

use std::path::Path;

use super::status::Status;

/// Replaces `path` with the status, atomically (readers never see half a document), with the
/// mode `File::create` gave it before (monitoring reads it as another user).
pub fn write(path: &Path, status: &Status) -> std::io::Result<()> {
    crate::atomic_file::write_atomic(
        path,
        (status.to_json() + "\n").as_bytes(),
        crate::atomic_file::MODE_DEFAULT,
    )
}
