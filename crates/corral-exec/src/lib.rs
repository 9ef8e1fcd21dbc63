//! corral's executor: the `/execute` and `/v1/exec` protocol, the server and the client.
//!
//! An agent's jail has no toolchains and no registry access; it asks the executor to run
//! `cargo test` or `npm install` in the project's environment and gets the output and exit
//! status back (SPEC section 6, seed 003's "Remote Code Execution as a Service").
//!
//! - [`proto`]: request bodies and NDJSON events, parsed once into [`ExecRequest`].
//! - [`reqenv`]: the variables a request may set (an allow-list).
//! - [`confine`]: the working directory never leaves the project root.
//! - [`spawn`]: the [`Spawner`] seam; [`HostSpawner`] runs each command as its own process group.
//! - [`server`]: `corral serve` (hyper): auth, limits, audit, and the per-command supervisor.
//! - [`client`]: discovery and the blocking HTTP/1.1 client behind `corral exec`.

pub mod client;
pub mod confine;
pub mod proto;
pub mod reqenv;
pub mod server;
pub mod spawn;
mod supervise;

pub use proto::{Event, ExecRequest, Exit, Stream};
pub use server::{ListenAddr, Server, ServerConfig};
pub use spawn::{HostSpawner, SpawnError, SpawnSpec, Spawned, Spawner, end_children};

/// The agent-facing instructions (`corral skill`): a SKILL.md in pi's skill format, whose
/// frontmatter `name` is [`SKILL_NAME`] (pi wants the skill's directory to carry that name).
pub const SKILL_MD: &str = include_str!("SKILL.md");
/// The skill's name, and the name of the directory its SKILL.md goes in.
pub const SKILL_NAME: &str = "corral-exec";
