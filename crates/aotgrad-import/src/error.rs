//! What can go wrong importing an exported program.

use std::path::PathBuf;
use thiserror::Error;

/// An error reading or mapping a `torch.export` archive. Every variant names the
/// archive; node errors also name the node, its ATen op and, when the archive
/// recorded it, the line of the user's PyTorch source that made it.
#[derive(Debug, Error)]
pub enum ImportError {
    /// The file could not be read, is not a zip archive, is truncated or damaged, or
    /// lacks a member a `torch.export.save` archive has.
    #[error("{path}: {msg}")]
    Archive {
        /// The archive.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// The archive was written by a schema (or archive format) this reader does not
    /// read.
    #[error("{path}: {what} {found} is not one this reader reads (it reads {reads}); export with a PyTorch whose torch.export schema is {reads}")]
    Version {
        /// The archive.
        path: PathBuf,
        /// Which version (`schema version`, `archive format`, ...).
        what: String,
        /// The archive's.
        found: String,
        /// The ones read.
        reads: String,
    },
    /// `models/model.json` or a weights config does not follow the export schema.
    #[error("{path}: {file}: {msg}")]
    Schema {
        /// The archive.
        path: PathBuf,
        /// The member.
        file: String,
        /// What does not follow the schema.
        msg: String,
    },
    /// A node aotgrad cannot run: an unknown op, an argument it does not take, an
    /// output it does not compute.
    #[error("{path}: node `{node}` ({op}){src}: {msg}")]
    Node {
        /// The archive.
        path: PathBuf,
        /// The node's name in the exported graph.
        node: String,
        /// Its op (`aten.linear.default`).
        op: String,
        /// `, from model.py:12` when the archive recorded the user's source line.
        src: String,
        /// What aotgrad cannot do.
        msg: String,
    },
    /// The program's signature uses what aotgrad does not import (effect tokens,
    /// custom objects, gradient outputs of a joint export, ...).
    #[error("{path}: {msg}")]
    Signature {
        /// The archive.
        path: PathBuf,
        /// What is not supported.
        msg: String,
    },
}

/// Shorthand for results of this crate's loading functions.
pub type Result<T> = std::result::Result<T, ImportError>;
