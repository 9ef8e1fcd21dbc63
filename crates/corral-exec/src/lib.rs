//! corral's executor: the /execute and /v1/exec protocol, the server and the client
