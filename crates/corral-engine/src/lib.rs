//! corral's container backend: podman and docker command lines generated from a Plan
