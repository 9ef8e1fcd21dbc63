//! corral's native Linux backend: namespaces, mounts, seccomp, Landlock, cgroups, a tiny init, a pty relay
