//! corral's egress proxy, the jail's network bridge, and the network audit
