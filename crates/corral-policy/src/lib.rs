//! corral's policy engine: the `corral.toml` schema and its layers, validation with errors that
//! point at file, line and column, harness profiles, the domain matcher and address classifier,
//! and the resolved [`Plan`] every backend consumes.

pub mod addr;
pub mod config;
pub mod consts;
pub mod domain;
pub mod error;
pub mod harness;
pub mod hide;
pub mod pathrule;
pub mod plan;
pub mod profile;
pub mod reqpath;
pub mod resolve;
pub mod signin;
pub mod toolchain;
pub mod tree;
pub mod trust;

pub use error::PolicyError;
pub use plan::Plan;
pub use resolve::{Flags, Request, resolve};
