//! A `pagetrain` child process whose stderr is read line by line, so that a test acts on what the
//! run has done (a checkpoint written) rather than on how long it has run.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

pub struct Run {
    pub child: Child,
    lines: Receiver<String>,
    /// Every stderr line read so far.
    pub seen: Vec<String>,
}

impl Run {
    pub fn start(args: &[&str]) -> Run {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pagetrain"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pagetrain");
        let stderr: ChildStderr = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Run { child, lines, seen: Vec::new() }
    }

    /// Waits (at most `timeout`) for a stderr line containing `marker`; panics with what the run
    /// printed when it ends or times out first.
    pub fn wait_for(&mut self, marker: &str, timeout: Duration) -> String {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(marker) {
                        return line;
                    }
                }
                Err(e) => panic!("no `{marker}` from the run ({e:?}); it printed:\n{}", self.seen.join("\n")),
            }
        }
    }

    /// Waits for the run to end; returns its success, stdout and the rest of its stderr.
    pub fn finish(self) -> (bool, String, String) {
        let Run { child, lines, mut seen } = self;
        let out = child.wait_with_output().expect("wait for pagetrain");
        seen.extend(lines.iter());
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), seen.join("\n"))
    }
}
