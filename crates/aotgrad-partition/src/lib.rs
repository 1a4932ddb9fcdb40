//! placeholder: helper G writes this crate
