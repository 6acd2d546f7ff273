//! The in-process transport: one thread per device, messages moved through per-receiver
//! mailboxes keyed by `(source, tag)` (zero copy: a sent [`Tensor`] or [`Value`] is moved, its
//! buffer is never copied or serialized; a GPU value stays on the GPU).

use super::transport::{CommError, Endpoint, Tag};
use crate::tensor::Tensor;
use crate::value::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often a waiting receiver re-checks the abort flag (an abort also wakes it at once).
const POLL: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Mailbox {
    queues: Mutex<HashMap<(usize, Tag), VecDeque<Value>>>,
    arrived: Condvar,
}

impl Mailbox {
    fn lock(&self) -> MutexGuard<'_, HashMap<(usize, Tag), VecDeque<Value>>> {
        // A panic while holding the lock cannot leave the map inconsistent (push/pop only).
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Shared {
    boxes: Vec<Mailbox>,
    aborted: AtomicBool,
}

/// One device's endpoint of the in-process transport (create them with [`endpoints`]).
pub struct InProcEndpoint {
    rank: usize,
    shared: Arc<Shared>,
}

/// Endpoints for `n` devices sharing one set of mailboxes and one abort flag.
pub fn endpoints(n: usize) -> Vec<InProcEndpoint> {
    let shared = Arc::new(Shared {
        boxes: (0..n).map(|_| Mailbox::default()).collect(),
        aborted: AtomicBool::new(false),
    });
    (0..n)
        .map(|rank| InProcEndpoint {
            rank,
            shared: shared.clone(),
        })
        .collect()
}

impl Endpoint for InProcEndpoint {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.boxes.len()
    }

    fn send(&mut self, dst: usize, tag: Tag, t: Tensor) -> Result<(), CommError> {
        self.send_value(dst, tag, Value::Host(t))
    }

    fn recv(&mut self, src: usize, tag: Tag, timeout: Duration) -> Result<Tensor, CommError> {
        self.recv_value(src, tag, timeout)?
            .into_host()
            .map_err(|e| CommError::Other(format!("copying a received value to the host: {e}")))
    }

    fn send_value(&mut self, dst: usize, tag: Tag, t: Value) -> Result<(), CommError> {
        let mb = self
            .shared
            .boxes
            .get(dst)
            .ok_or_else(|| CommError::Other(format!("send to device {dst}: no such device")))?;
        mb.lock().entry((self.rank, tag)).or_default().push_back(t);
        mb.arrived.notify_all();
        Ok(())
    }

    fn recv_value(&mut self, src: usize, tag: Tag, timeout: Duration) -> Result<Value, CommError> {
        if src >= self.size() {
            return Err(CommError::Other(format!(
                "receive from device {src}: no such device"
            )));
        }
        let mb = &self.shared.boxes[self.rank];
        let start = Instant::now();
        let deadline = start + timeout;
        let mut q = mb.lock();
        loop {
            if let Some(t) = q.get_mut(&(src, tag)).and_then(VecDeque::pop_front) {
                return Ok(t);
            }
            if self.is_aborted() {
                return Err(CommError::Aborted);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    src,
                    tag,
                    waited: now - start,
                });
            }
            let wait = (deadline - now).min(POLL);
            q = mb
                .arrived
                .wait_timeout(q, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn abort(&self) {
        self.shared.aborted.store(true, Ordering::SeqCst);
        for b in &self.shared.boxes {
            // Take the lock so a receiver between its flag check and its wait is not missed.
            let _g = b.lock();
            b.arrived.notify_all();
        }
    }

    fn is_aborted(&self) -> bool {
        self.shared.aborted.load(Ordering::SeqCst)
    }

    fn moves_values(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ArrayD;

    fn t(v: f32) -> Tensor {
        Tensor::F32(ArrayD::from_elem(ndarray::IxDyn(&[2]), v))
    }

    #[test]
    fn fifo_per_source_and_tag() {
        let mut eps = endpoints(2);
        let (a, b) = eps.split_at_mut(1);
        a[0].send(1, Tag::p2p(7), t(1.0)).unwrap();
        a[0].send(1, Tag::p2p(8), t(3.0)).unwrap();
        a[0].send(1, Tag::p2p(7), t(2.0)).unwrap();
        let d = Duration::from_millis(10);
        assert_eq!(b[0].recv(0, Tag::p2p(8), d).unwrap(), t(3.0));
        assert_eq!(b[0].recv(0, Tag::p2p(7), d).unwrap(), t(1.0));
        assert_eq!(b[0].recv(0, Tag::p2p(7), d).unwrap(), t(2.0));
        let e = b[0].recv(0, Tag::p2p(7), d).unwrap_err();
        assert!(matches!(e, CommError::Timeout { src: 0, .. }), "{e}");
    }

    #[test]
    fn abort_wakes_a_waiting_receiver() {
        let mut eps = endpoints(2);
        let mut b = eps.pop().unwrap();
        let a = eps.pop().unwrap();
        let start = Instant::now();
        std::thread::scope(|s| {
            let h = s.spawn(move || b.recv(0, Tag::p2p(1), Duration::from_secs(30)));
            std::thread::sleep(Duration::from_millis(50));
            a.abort();
            assert_eq!(h.join().unwrap().unwrap_err(), CommError::Aborted);
        });
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}
