//! The byte relay of an established tunnel: two directions, bounded by the buffer budget, and
//! the relay that owes its connection's close record.

use super::*;

/// One direction of a tunnel. Idle, it holds no buffer: data is read into a buffer on the poll
/// function's stack and written straight on; only bytes the writer cannot take yet are copied to
/// the heap, and freed once written. 1,000 idle tunnels thus cost sockets and tasks, not buffers.
/// Those copies are counted in the proxy's buffer budget, if any: past it, reads shrink to
/// [`TUNNEL_READ_TIGHT`], so what a jail that stops reading makes corral hold stays small.
struct Direction {
    pending: Option<(Box<[u8]>, usize)>,
    read_done: bool,
    shut_down: bool,
    bytes: u64,
    budget: Option<Arc<Budget>>,
}

impl Direction {
    fn new(budget: Option<Arc<Budget>>) -> Direction {
        Direction {
            pending: None,
            read_done: false,
            shut_down: false,
            bytes: 0,
            budget,
        }
    }

    /// Keep `data` until the writer takes it (counted in the budget).
    fn hold(&mut self, data: &[u8]) {
        if let Some(b) = &self.budget {
            b.charge(data.len());
        }
        self.pending = Some((data.to_vec().into_boxed_slice(), 0));
    }

    /// The pending data is written (or dropped): give its bytes back.
    fn release(&mut self) {
        if let Some((buf, _)) = self.pending.take()
            && let Some(b) = &self.budget
        {
            b.give(buf.len());
        }
    }

    /// How much to read at once: less when the budget is spent.
    fn read_size(&self) -> usize {
        match &self.budget {
            Some(b) if b.used().saturating_add(TUNNEL_READ) > b.limit() => TUNNEL_READ_TIGHT,
            _ => TUNNEL_READ,
        }
    }
}

impl Drop for Direction {
    fn drop(&mut self) {
        self.release();
    }
}

const TUNNEL_READ: usize = 64 * 1024;
/// A tunnel's read size once the proxy's buffer budget is spent.
const TUNNEL_READ_TIGHT: usize = 1024;

fn poll_direction<R, W>(
    cx: &mut Context<'_>,
    mut r: Pin<&mut R>,
    mut w: Pin<&mut W>,
    d: &mut Direction,
) -> Poll<io::Result<()>>
where
    R: AsyncRead + ?Sized,
    W: AsyncWrite + ?Sized,
{
    // Bound the work done in one poll so the other direction and other tasks get their turn.
    for _ in 0..32 {
        if let Some((buf, pos)) = d.pending.as_mut() {
            while *pos < buf.len() {
                match w.as_mut().poll_write(cx, &buf[*pos..]) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => *pos += n,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            d.release();
        }
        if d.read_done {
            if !d.shut_down {
                match w.as_mut().poll_shutdown(cx) {
                    Poll::Ready(_) => d.shut_down = true,
                    Poll::Pending => return Poll::Pending,
                }
            }
            return Poll::Ready(Ok(()));
        }
        let mut stack = [0u8; TUNNEL_READ];
        let size = d.read_size();
        let mut rb = ReadBuf::new(&mut stack[..size]);
        match r.as_mut().poll_read(cx, &mut rb) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => {}
        }
        let n = rb.filled().len();
        if n == 0 {
            d.read_done = true;
            continue;
        }
        d.bytes += n as u64;
        let mut pos = 0;
        while pos < n {
            match w.as_mut().poll_write(cx, &stack[pos..n]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(k)) => pos += k,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    d.hold(&stack[pos..n]);
                    return Poll::Pending;
                }
            }
        }
    }
    cx.waker().wake_by_ref();
    Poll::Pending
}

/// Relay bytes both ways until both sides close, either fails, or nothing moves for `idle`.
/// Resolves to (bytes a->b, bytes b->a). Data a writer cannot take yet is counted in `budget`.
pub(crate) fn tunnel<A, B>(a: A, b: B, idle: Duration, budget: Option<Arc<Budget>>) -> Relay<A, B>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    Relay {
        a,
        b,
        up: Direction::new(budget.clone()),
        down: Direction::new(budget),
        timer: None,
        idle,
    }
}

/// The future of [`tunnel`], written out by hand so an idle tunnel holds exactly this: the two
/// streams, two small `Direction`s and its idle timer (created at the first poll).
pub(crate) struct Relay<A, B> {
    a: A,
    b: B,
    up: Direction,
    down: Direction,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    idle: Duration,
}

impl<A, B> Future for Relay<A, B>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    type Output = (u64, u64);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<(u64, u64)> {
        let r = self.get_mut();
        let moved = r.up.bytes + r.down.bytes;
        let r1 = poll_direction(cx, Pin::new(&mut r.a), Pin::new(&mut r.b), &mut r.up);
        let r2 = poll_direction(cx, Pin::new(&mut r.b), Pin::new(&mut r.a), &mut r.down);
        match (r1, r2) {
            (Poll::Ready(Err(_)), _) | (_, Poll::Ready(Err(_))) => {
                return Poll::Ready((r.up.bytes, r.down.bytes));
            }
            (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => {
                return Poll::Ready((r.up.bytes, r.down.bytes));
            }
            _ => {}
        }
        let idle = r.idle;
        let timer = r
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        if r.up.bytes + r.down.bytes != moved {
            timer.as_mut().reset(tokio::time::Instant::now() + idle);
        }
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready((r.up.bytes, r.down.bytes));
        }
        Poll::Pending
    }
}

/// A relay whose close record is owed (open.rs): it keeps the record's counters current, and
/// when the proxy shuts down it ends at its next poll (both sockets closed). Its record is
/// written when it ends, either way.
pub(crate) struct RecordedRelay<A, B> {
    relay: Relay<A, B>,
    /// Its close record; `None` once written.
    owed: Option<Owed>,
    /// Bytes the client sent before the relay started (already written upstream).
    early: u64,
}

impl<A, B> RecordedRelay<A, B>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    pub(crate) fn new(relay: Relay<A, B>, owed: Owed, early: u64) -> Self {
        RecordedRelay {
            relay,
            owed: Some(owed),
            early,
        }
    }
}

impl<A, B> Future for RecordedRelay<A, B>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let t = self.get_mut();
        let done = Pin::new(&mut t.relay).poll(cx);
        let (up, down) = match done {
            Poll::Ready(bytes) => bytes,
            Poll::Pending => (t.relay.up.bytes, t.relay.down.bytes),
        };
        let Some(owed) = t.owed.take() else {
            return Poll::Ready(());
        };
        if done.is_pending() && !owed.stopped(cx) {
            owed.set_bytes(up + t.early, down);
            t.owed = Some(owed);
            return Poll::Pending;
        }
        owed.close(up + t.early, down);
        Poll::Ready(())
    }
}
