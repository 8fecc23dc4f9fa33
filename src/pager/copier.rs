//! Background copies between host memory and mapped staging memory. The recording thread hands a
//! copy to a pool of worker threads and records on; it waits for the copy only when the bytes must
//! be in place: before the submission that reads a filled upload slot, and before a delivered
//! readback slot is reused. One thread of memcpy does not saturate the bus (7 GB/s on an H200
//! host against 25 GB/s with 4–8), and copies in both directions run at once.
//!
//! In the browser there are no threads: copies run inline.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Pieces a copy is cut into, so several workers share a large one.
const PIECE: usize = 1 << 20;

/// A copy in flight; cloning gives another handle to the same copy.
#[derive(Clone)]
pub struct Ticket(Arc<Progress>);

struct Progress {
    left: AtomicUsize,
    lock: Mutex<()>,
    done: Condvar,
}

impl Ticket {
    fn new(pieces: usize) -> Ticket {
        Ticket(Arc::new(Progress { left: AtomicUsize::new(pieces), lock: Mutex::new(()), done: Condvar::new() }))
    }

    /// A copy of nothing, done already.
    pub fn finished() -> Ticket {
        Ticket::new(0)
    }

    pub fn is_done(&self) -> bool {
        self.0.left.load(Ordering::Acquire) == 0
    }

    /// Blocks until every piece is copied.
    pub fn wait(&self) {
        let mut guard = self.0.lock.lock().unwrap_or_else(|e| e.into_inner());
        while !self.is_done() {
            guard = self.0.done.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn piece_done(&self) {
        if self.0.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _guard = self.0.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.0.done.notify_all();
        }
    }
}

/// One piece of a copy. The pointers cross threads: see the SAFETY contract of [`Copier::copy`].
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
struct Piece {
    dst: *mut u8,
    src: *const u8,
    len: usize,
    ticket: Ticket,
}

// SAFETY: a piece's ranges are disjoint from every other piece's and, by `Copier::copy`'s
// contract, untouched by anyone else until its ticket is done.
unsafe impl Send for Piece {}

#[derive(Default)]
struct Queue {
    pieces: std::collections::VecDeque<Piece>,
    closed: bool,
}

/// The pool of copy threads (none in the browser).
pub struct Copier {
    shared: Arc<(Mutex<Queue>, Condvar)>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Copier {
    /// A pool of up to 8 threads (fewer on smaller machines; `PAGETRAIN_COPY_THREADS` overrides).
    pub fn new() -> Copier {
        let shared = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
        #[cfg(not(target_arch = "wasm32"))]
        let workers = {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let asked = std::env::var("PAGETRAIN_COPY_THREADS").ok().and_then(|v| v.parse::<usize>().ok());
            let n = asked.unwrap_or(cores.min(8)).max(1);
            (0..n)
                .filter_map(|i| {
                    let shared = shared.clone();
                    std::thread::Builder::new().name(format!("pagetrain-copy-{i}")).spawn(move || work(&shared)).ok()
                })
                .collect()
        };
        #[cfg(target_arch = "wasm32")]
        let workers = Vec::new();
        Copier { shared, workers }
    }

    /// Starts copying `len` bytes from `src` to `dst` and returns at once.
    ///
    /// # Safety
    /// `src` must stay valid for reads and `dst` for writes of `len` bytes, the ranges must not
    /// overlap, and nothing else may write `src` or touch `dst` until the ticket is done.
    pub unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) -> Ticket {
        if self.workers.is_empty() || len == 0 {
            let ticket = Ticket::new(1);
            // SAFETY: the caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
            ticket.piece_done();
            return ticket;
        }
        let pieces = len.div_ceil(PIECE);
        let ticket = Ticket::new(pieces);
        let (queue, wake) = &*self.shared;
        let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
        for i in 0..pieces {
            let at = i * PIECE;
            // SAFETY: `at < len`, so both offsets stay inside the caller's ranges.
            let (d, s) = unsafe { (dst.add(at), src.add(at)) };
            q.pieces.push_back(Piece { dst: d, src: s, len: PIECE.min(len - at), ticket: ticket.clone() });
        }
        drop(q);
        wake.notify_all();
        ticket
    }
}

impl Default for Copier {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn work(shared: &(Mutex<Queue>, Condvar)) {
    let (queue, wake) = shared;
    loop {
        let piece = {
            let mut q = queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(p) = q.pieces.pop_front() {
                    break p;
                }
                if q.closed {
                    return;
                }
                q = wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        // SAFETY: `Copier::copy`'s contract keeps both ranges valid and private to this piece.
        unsafe { std::ptr::copy_nonoverlapping(piece.src, piece.dst, piece.len) };
        piece.ticket.piece_done();
    }
}

impl Drop for Copier {
    fn drop(&mut self) {
        let (queue, wake) = &*self.shared;
        queue.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_of_every_size_arrive_whole() {
        let copier = Copier::new();
        for len in [0, 1, 4095, PIECE - 1, PIECE, 3 * PIECE + 17] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let mut dst = vec![0u8; len];
            // SAFETY: both vectors outlive the wait below and are not touched until then.
            let ticket = unsafe { copier.copy(dst.as_mut_ptr(), src.as_ptr(), len) };
            ticket.wait();
            assert!(ticket.is_done());
            assert_eq!(dst, src, "copy of {len} bytes");
        }
    }
}
