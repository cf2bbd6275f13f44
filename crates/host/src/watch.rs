//! Waiting for a file to be written, told by the kernel (inotify) rather
//! than found by reading it again and again: a server's status file says
//! when it is ready, and the daemon learns of each change as it is made.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// A watch on one file's writes, by its name in a directory: the file may
/// not exist yet, and may be made again under the same name.
pub struct FileWatch {
    /// Always `Some` but while dropped.
    inotify: Option<AsyncFd<Watched>>,
    name: std::ffi::OsString,
}

impl Drop for FileWatch {
    fn drop(&mut self) {
        // Closing an inotify instance waits for a grace period of the
        // kernel's (about 10 ms here): done on a blocking thread, not on the
        // task that waited for the file (a fork's clock).
        let Some(inotify) = self.inotify.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || drop(inotify))),
            Err(_) => drop(inotify),
        }
    }
}

/// The inotify instance, as `AsyncFd` needs it.
struct Watched(Inotify);

impl AsRawFd for Watched {
    fn as_raw_fd(&self) -> RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

impl FileWatch {
    /// Watches writes to `dir/name`: a write finished (its descriptor
    /// closed), a change of content, or the name made or moved in.
    pub fn new(dir: &Path, name: &OsStr) -> io::Result<FileWatch> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        let flags = AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_ONLYDIR
            | AddWatchFlags::IN_DONT_FOLLOW;
        inotify.add_watch(dir, flags)?;
        // SAFETY: the inotify descriptor is owned by the `AsyncFd` and neither
        // replaced nor closed while it is registered.
        let inotify = unsafe { AsyncFd::register_with_interest(Watched(inotify), Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(FileWatch { inotify: Some(inotify), name: name.to_owned() })
    }

    /// Waits until the file was written, or `most` has passed (so a caller
    /// also notices what no write tells, such as its writer's exit). Returns
    /// whether it was written.
    pub async fn written(&self, most: Duration) -> bool {
        tokio::time::timeout(most, self.next_write()).await.unwrap_or(false)
    }

    async fn next_write(&self) -> bool {
        let Some(inotify) = &self.inotify else { return false };
        loop {
            let Ok(mut ready) = inotify.readable().await else { return false };
            match ready.get_inner().0.read_events() {
                Ok(events) => {
                    // An overflowed queue lost events: count it as a write, so the
                    // caller reads the file again.
                    if events.iter().any(|e| {
                        e.name.as_deref() == Some(self.name.as_os_str())
                            || e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW)
                    }) {
                        return true;
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => ready.clear_ready(),
                Err(_) => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_write_to_the_file_is_told_and_other_files_are_not() {
        let dir = crate::test_dir("watch");
        let watch = FileWatch::new(&dir, OsStr::new("status")).unwrap();
        std::fs::write(dir.join("other"), b"x").unwrap();
        assert!(!watch.written(Duration::from_millis(50)).await, "another file's write was told");
        let path = dir.join("status");
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            std::fs::write(path, b"ready").unwrap();
        });
        assert!(watch.written(Duration::from_secs(5)).await, "the file's write was not told");
        writer.await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
