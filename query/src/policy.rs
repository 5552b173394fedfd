//! Which SQL statements may touch files: statements that write files (`COPY ... TO`,
//! `INSERT` and other DML) need write access, and `CREATE EXTERNAL TABLE` (which reads any
//! file it is pointed at) needs file access; both are off unless the session's
//! [`FileAccess`] turns them on (`--allow-write`, `--allow-files`, `\set allow_write on`).
//! Nothing ever writes inside the store directory, whatever the access.
//!
//! Decided on the logical plan, never on the SQL text: DataFusion's [`SQLOptions`] refuses
//! DML and COPY, and the plan's `CopyTo` targets, DML target tables and external table
//! locations are checked here.

use crate::pin::SessionStore;
use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::source_as_provider;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::{SQLOptions, SessionContext, SessionState};
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// What a session's statements may do with files outside the store's tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileAccess {
    /// `COPY ... TO`, `INSERT INTO` (and other DML) may write files.
    pub write: bool,
    /// `CREATE EXTERNAL TABLE` may read files.
    pub read: bool,
}

/// The session's file access (none unless set).
pub fn file_access(state: &SessionState) -> FileAccess {
    state
        .config()
        .get_extension::<FileAccess>()
        .map(|a| *a)
        .unwrap_or_default()
}

/// Sets the file access of `ctx`'s later statements.
pub fn set_file_access(ctx: &SessionContext, access: FileAccess) {
    ctx.state_ref()
        .write()
        .config_mut()
        .set_extension(Arc::new(access));
}

fn refused(message: String) -> DataFusionError {
    DataFusionError::Plan(message)
}

/// Refuses `plan` when it needs file access the session does not have, or would write
/// inside the store.
pub fn verify(state: &SessionState, plan: &LogicalPlan) -> Result<()> {
    let access = file_access(state);
    let store_root = state
        .config()
        .get_extension::<SessionStore>()
        .map(|s| s.0.root().to_path_buf());
    if !access.write {
        let writes = SQLOptions::new().with_allow_dml(false).verify_plan(plan);
        if writes.is_err() {
            return Err(refused(format!(
                "{} writes files, which is off by default: `gpuq query --allow-write` or \
                 `gpuq sql --allow-write` (`\\set allow_write on` in the shell) allows it",
                what_writes(plan)
            )));
        }
    }
    let mut outcome = Ok(());
    plan.apply_with_subqueries(|node| {
        let problem = match node {
            LogicalPlan::Copy(copy) => {
                write_target_problem(store_root.as_deref(), &copy.output_url)
            }
            LogicalPlan::Dml(dml) => source_as_provider(&dml.target)
                .ok()
                .and_then(|p| listing_paths(p.as_ref()))
                .into_iter()
                .flatten()
                .find_map(|url| write_target_problem(store_root.as_deref(), &url)),
            LogicalPlan::Ddl(DdlStatement::CreateExternalTable(t)) if !access.read => {
                Some(format!(
                    "CREATE EXTERNAL TABLE reads files ({}), which is off by default: \
                 `gpuq query --allow-files` or `gpuq sql --allow-files` \
                 (`\\set allow_files on` in the shell) allows it",
                    t.locations.join(", ")
                ))
            }
            _ => None,
        };
        match problem {
            Some(p) => {
                outcome = Err(refused(p));
                Ok(TreeNodeRecursion::Stop)
            }
            None => Ok(TreeNodeRecursion::Continue),
        }
    })?;
    outcome
}

/// How the refused statement is called in the message.
fn what_writes(plan: &LogicalPlan) -> String {
    let mut what = "the statement".to_string();
    let _ = plan.apply_with_subqueries(|node| {
        match node {
            LogicalPlan::Copy(c) => what = format!("COPY ... TO '{}'", c.output_url),
            LogicalPlan::Dml(d) => what = format!("{} {}", d.op, d.table_name),
            _ => return Ok(TreeNodeRecursion::Continue),
        }
        Ok(TreeNodeRecursion::Stop)
    });
    what
}

/// The file locations of a table that writes go to, when it is a listing (file) table.
fn listing_paths(provider: &dyn TableProvider) -> Option<Vec<String>> {
    let listing = provider.downcast_ref::<ListingTable>()?;
    Some(
        listing
            .table_paths()
            .iter()
            .map(|u| u.to_string())
            .collect(),
    )
}

/// Why writing to `url` is refused, if it is: a place inside the store directory.
fn write_target_problem(store_root: Option<&Path>, url: &str) -> Option<String> {
    let root = store_root?;
    let target = local_path(url)?;
    let resolved = resolve(&target);
    resolved.starts_with(root).then(|| {
        format!(
            "writing to {url} is refused: it is inside the store ({}), which only gpuq's own \
             commands change",
            root.display()
        )
    })
}

/// The local file system path of a write target (`file://` URLs and plain paths).
fn local_path(url: &str) -> Option<PathBuf> {
    if let Some(rest) = url.strip_prefix("file://") {
        return Some(PathBuf::from(rest));
    }
    if url.contains("://") {
        return None;
    }
    let path = PathBuf::from(url);
    if path.is_absolute() {
        Some(path)
    } else {
        std::env::current_dir().ok().map(|d| d.join(path))
    }
}

/// `path` as the kernel would resolve it: component by component, following the symbolic
/// links that exist and applying `..` to what they resolved to.
fn resolve(path: &Path) -> PathBuf {
    let mut at = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            Component::ParentDir => {
                at.pop();
            }
            Component::Normal(name) => {
                at.push(name);
                if let Ok(real) = std::fs::canonicalize(&at) {
                    at = real;
                }
            }
        }
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_resolves_through_links_and_dots_as_the_kernel_would() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let store = root.join("store");
        std::fs::create_dir_all(store.join("_manifest")).unwrap();
        let elsewhere = root.join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(store.join("_manifest"), elsewhere.join("link")).unwrap();
        let via_link = elsewhere.join("link/../x.json");
        assert_eq!(resolve(&via_link), store.join("x.json"));
        let dotted = elsewhere.join("../store/./new/file.csv");
        assert_eq!(resolve(&dotted), store.join("new/file.csv"));
        assert!(write_target_problem(Some(&store), &via_link.to_string_lossy()).is_some());
        assert!(
            write_target_problem(Some(&store), &elsewhere.join("out.csv").to_string_lossy())
                .is_none()
        );
        assert!(write_target_problem(Some(&store), "s3://bucket/x").is_none());
    }
}
