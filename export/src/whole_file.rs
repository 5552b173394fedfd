//! Output files that appear whole or not at all: what `gpuq export` and `gpuq report` write
//! (from the CLI and from Python), so a viewer never opens half a trace.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Written as a hidden file beside its name, renamed by [`WholeFile::commit`]; dropped
/// uncommitted, it is removed. Errors name the file.
pub struct WholeFile {
    pub file: File,
    tmp: PathBuf,
    path: PathBuf,
    committed: bool,
}

fn naming(path: &Path) -> impl FnOnce(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

impl WholeFile {
    pub fn create(path: &Path) -> io::Result<WholeFile> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "output".into());
        let tmp = path.with_file_name(format!(".{name}.tmp"));
        let file = File::create(&tmp).map_err(naming(&tmp))?;
        Ok(WholeFile {
            file,
            tmp,
            path: path.to_path_buf(),
            committed: false,
        })
    }

    pub fn commit(mut self) -> io::Result<()> {
        self.file.sync_all().map_err(naming(&self.tmp))?;
        std::fs::rename(&self.tmp, &self.path).map_err(naming(&self.path))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for WholeFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_appears_only_when_committed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.pftrace");
        let mut out = WholeFile::create(&path).unwrap();
        out.file.write_all(b"x").unwrap();
        assert!(!path.exists());
        out.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"x");

        let mut dropped = WholeFile::create(&dir.path().join("u")).unwrap();
        dropped.file.write_all(b"y").unwrap();
        drop(dropped);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no leftovers"
        );
    }

    #[test]
    fn errors_name_the_file() {
        let err = WholeFile::create(Path::new("/no/such/dir/t.json"))
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("/no/such/dir/.t.json.tmp"),
            "{err}"
        );
    }
}
