//! `network.publish` and `network.host_ports` for the harness container: relays corral runs from
//! the host, with one end in the container's network namespace.
//!
//! Neither engine forwards ports of a container on an `--internal` network (`--publish` is
//! accepted and nothing answers), and the harness's loopback is its own. So corral binds
//! 127.0.0.1:PORT on the host for each published port before the container starts, and once the
//! container runs it joins the container's network namespace from its own threads
//! (`setns(CLONE_NEWNET)` is per thread) to connect to the harness's 127.0.0.1:PORT, or, for a
//! host port, to listen on the harness's 127.0.0.1:PORT and connect each connection to the
//! host's. Joining the namespace takes CAP_SYS_ADMIN over its owner: root only (rootful podman,
//! docker run by root); otherwise [`crate::argv::setup`] refuses the plan.
//!
//! The relays exist from the moment the engine reports the container's process, a few
//! milliseconds after the harness starts: a harness that connects to a host port at once may
//! retry, as it would for any service that starts beside it.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use corral_policy::plan::{NetworkMode, Plan};

use crate::{Command, Context, EngineError, Result};

/// The host listeners of the published ports, bound before the container starts (a port in use
/// is an error before anything runs).
pub struct Relays {
    published: Vec<(u16, TcpListener)>,
    host_ports: Vec<u16>,
    done: Arc<AtomicBool>,
}

impl Relays {
    /// Bind 127.0.0.1:PORT on the host for each of the plan's published ports.
    /// Nothing with `network.mode = "host"`: the harness's ports are the host's already.
    pub fn bind(plan: &Plan) -> Result<Self> {
        let host = plan.network.mode == NetworkMode::Host;
        let mut published = Vec::new();
        for &port in plan.network.publish.iter().filter(|_| !host) {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let l = TcpListener::bind(addr).map_err(|source| EngineError::Io {
                path: PathBuf::from(format!("publish: binding {addr} on the host")),
                source,
            })?;
            published.push((port, l));
        }
        Ok(Self {
            published,
            host_ports: if host {
                Vec::new()
            } else {
                plan.network.host_ports.clone()
            },
            done: Arc::new(AtomicBool::new(false)),
        })
    }

    fn is_empty(&self) -> bool {
        self.published.is_empty() && self.host_ports.is_empty()
    }

    /// Wait (in a thread) for the harness container to run, then relay. Returns at once; the
    /// relays stop taking connections when the returned guard is dropped.
    pub fn start(self, ctx: &Context, plan: &Plan) -> RelayGuard {
        let done = self.done.clone();
        if self.is_empty() {
            return RelayGuard(done);
        }
        let inspect = Command::new(ctx.engine.program()).args([
            "inspect",
            "--format",
            "{{.State.Pid}}",
            &ctx.harness_container(plan),
        ]);
        let stopped = done.clone();
        thread::spawn(move || {
            if let Err(e) = self.relay(&inspect)
                && !stopped.load(Ordering::Relaxed)
            {
                eprintln!("corral: publish/host_ports: {e}");
            }
        });
        RelayGuard(done)
    }

    fn relay(self, inspect: &Command) -> io::Result<()> {
        let pid = loop {
            if self.done.load(Ordering::Relaxed) {
                return Ok(());
            }
            if let Ok(out) = inspect.to_std().output() {
                let pid = String::from_utf8_lossy(&out.stdout).trim().parse::<u32>();
                if let Ok(pid @ 1..) = pid {
                    break pid;
                }
            }
            thread::sleep(Duration::from_millis(50));
        };
        let netns = Arc::new(File::open(format!("/proc/{pid}/ns/net"))?);
        let host_ns = Arc::new(File::open("/proc/thread-self/ns/net")?);
        for (port, listener) in self.published {
            let netns = netns.clone();
            thread::spawn(move || {
                for conn in listener.incoming().flatten() {
                    let netns = netns.clone();
                    thread::spawn(move || {
                        let _ = connect_in(&netns, port).map(|inner| pipe(conn, inner));
                    });
                }
            });
        }
        for port in self.host_ports {
            let (netns, host_ns) = (netns.clone(), host_ns.clone());
            thread::spawn(move || {
                // This thread stays in the container's namespace: its listener is there.
                if let Err(e) = join(&netns) {
                    eprintln!("corral: host_ports {port}: joining the container's network: {e}");
                    return;
                }
                let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                let listener = match TcpListener::bind(addr) {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("corral: host_ports {port}: listening in the container: {e}");
                        return;
                    }
                };
                for conn in listener.incoming().flatten() {
                    let host_ns = host_ns.clone();
                    // A new thread starts in this one's namespace: it goes back to the host's.
                    thread::spawn(move || {
                        let _ = connect_in(&host_ns, port).map(|outer| pipe(conn, outer));
                    });
                }
            });
        }
        Ok(())
    }
}

/// Stops the relays from waiting for a container that is gone.
pub struct RelayGuard(Arc<AtomicBool>);

impl Drop for RelayGuard {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Move the calling thread into a network namespace.
fn join(netns: &File) -> io::Result<()> {
    // SAFETY: setns with a descriptor we own and a namespace type; it changes only this thread.
    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A connection to 127.0.0.1:PORT in `netns`, made from the calling thread (which stays there).
fn connect_in(netns: &File, port: u16) -> io::Result<TcpStream> {
    join(netns)?;
    TcpStream::connect((Ipv4Addr::LOCALHOST, port))
}

/// Copy both ways until each side has finished sending.
fn pipe(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let back = thread::spawn(move || copy_then_close(b2, a2));
    copy_then_close(a, b);
    let _ = back.join();
}

fn copy_then_close(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}
