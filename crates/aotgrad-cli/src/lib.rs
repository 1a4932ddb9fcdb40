//! The `aotgrad` command line, as a library so its parts are tested directly:
//! [`data`] (Fashion-MNIST's IDX files), [`models`] (the MLP and the vision
//! transformer), [`train`] (the training loop, metrics, checkpoints, resume) and
//! [`plot`] (the curves), [`explain`] (every compile stage of a program) and
//! [`cache`] (the compiled-result cache), [`import`] (PyTorch `torch.export`
//! archives).

pub mod cache;
pub mod data;
pub mod explain;
pub mod import;
pub mod models;
pub mod plot;
pub mod train;
