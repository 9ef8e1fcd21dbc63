//! Running a program the test has just written or copied.
//!
//! Tests run on parallel threads of one process. While one thread still has a new executable
//! open for writing, another thread's `fork` copies that descriptor into its child until the
//! child execs; executing the file in that window fails with ETXTBSY ("Text file busy"). The
//! file is complete; only the timing is wrong, so the exec is retried.

use std::io::ErrorKind;
use std::process::{Command, Output};
use std::time::Duration;

pub trait OutputRetrying {
    /// `Command::output`, retried while the executable is busy; panics on any other error.
    fn output_retrying(&mut self) -> Output;
}

impl OutputRetrying for Command {
    fn output_retrying(&mut self) -> Output {
        for _ in 0..100 {
            match self.output() {
                Err(e) if e.kind() == ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                other => return other.unwrap(),
            }
        }
        panic!("{self:?}: the executable stayed busy (ETXTBSY) for 2 s");
    }
}
