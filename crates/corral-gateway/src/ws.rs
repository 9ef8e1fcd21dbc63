//! What a secret-bound origin sends after a websocket `101`, scrubbed message by message.
//!
//! The gateway re-frames the origin's data messages (RFC 6455 §5.4 lets an intermediary change
//! the fragmentation of a connection with no extension; the gateway strips
//! `Sec-WebSocket-Extensions`). Each message's payload goes through one stream scrubber, across
//! all its frames: bytes at the end of a frame that could begin a real value are held back and
//! carried into the next frame of the message, so a value split across a frame and its
//! continuation is replaced like one inside a frame. What goes out is sent as fragments of the
//! same message: at the end of each frame (a `FIN` frame releases everything held, replaced where
//! it matches), or once [`CHUNK`] bytes are ready inside a long frame. Nothing waits for a later
//! message, and at most the length of the longest value minus one byte is held. A prefix of a
//! value is never released by itself: a connection cut inside a message drops what is held.
//!
//! Control frames (ping, pong, close) may come between the fragments of a message: each is
//! scrubbed whole with a same-length replacement (their payloads stay within 125 bytes) and sent
//! at its last byte. A masked frame (origins must not mask, but may) is unmasked to be scrubbed
//! and what is sent for it is masked with its key again.
//!
//! Anything that is not a valid frame sequence from an origin with no extension (a reserved bit,
//! an unknown opcode, a fragmented control frame, a continuation outside a message, a new message
//! inside one) ends frame parsing: the rest of the connection goes through the plain stream
//! scrubber, which never lets a value through either (what a message's scrubber held is dropped
//! then: its rest would come after bytes that break the match).

use corral_http1::io::Replacer;

/// Longest frame header: 2 bytes, a 64-bit length, a mask key.
const MAX_HEAD: usize = 14;

/// Scrubbed bytes of a long frame sent as a fragment once this many are ready.
const CHUNK: usize = 16 * 1024;

/// The origin-to-jail half of a spliced websocket.
pub(crate) struct FrameScrubber {
    /// The data message's scrubber; what it holds carries across the message's frames.
    message: Replacer,
    /// For control frames: the same values, replaced with their own length.
    control: Replacer,
    /// The scrubber as it starts, holding nothing.
    fresh: Replacer,
    /// The opcode of the data message in progress, and whether a fragment of it went out.
    in_message: Option<(u8, bool)>,
    state: FrameState,
}

/// Where the scrubber is: in a frame's header, in its payload, or in a non-websocket stream.
enum FrameState {
    /// Collecting a frame header.
    Head { bytes: [u8; MAX_HEAD], have: usize },
    /// Inside a frame's payload: `left` bytes to come, `fed` taken in so far (the mask's
    /// position); `ready`: scrubbed bytes not yet sent (a control frame's whole payload).
    Payload {
        head: Head,
        left: u64,
        fed: u64,
        ready: Vec<u8>,
    },
    /// Not a websocket stream: the plain stream scrubber from here on.
    Stream,
}

/// A parsed frame header.
#[derive(Clone, Copy)]
pub(crate) struct Head {
    pub(crate) fin: bool,
    pub(crate) opcode: u8,
    pub(crate) len: u64,
    pub(crate) mask: Option<[u8; 4]>,
}

/// The frame header `b` begins with its length in bytes, `None` while incomplete; `Err` when
/// the bytes cannot begin a frame an origin may send.
pub(crate) fn parse_head(b: &[u8]) -> Result<Option<(usize, Head)>, ()> {
    if b.len() < 2 {
        return Ok(None);
    }
    let (fin, rsv, opcode) = (b[0] & 0x80 != 0, b[0] & 0x70, b[0] & 0x0f);
    let (masked, len7) = (b[1] & 0x80 != 0, b[1] & 0x7f);
    let control = opcode >= 8;
    if rsv != 0 || !matches!(opcode, 0 | 1 | 2 | 8 | 9 | 10) || (control && (!fin || len7 > 125)) {
        return Err(());
    }
    let ext = match len7 {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let need = 2 + ext + if masked { 4 } else { 0 };
    if b.len() < need {
        return Ok(None);
    }
    let len = match ext {
        0 => u64::from(len7),
        2 => u64::from(u16::from_be_bytes([b[2], b[3]])),
        _ => {
            let len = u64::from_be_bytes(b[2..10].try_into().expect("8 bytes"));
            if len >> 63 != 0 {
                return Err(());
            }
            len
        }
    };
    let mask = masked.then(|| b[need - 4..need].try_into().expect("4 bytes"));
    Ok(Some((
        need,
        Head {
            fin,
            opcode,
            len,
            mask,
        },
    )))
}

/// XOR `data` with `key`, starting at payload offset `at`.
pub(crate) fn apply_mask(data: &mut [u8], key: [u8; 4], at: u64) {
    for (i, b) in data.iter_mut().enumerate() {
        *b ^= key[((at + i as u64) % 4) as usize];
    }
}

/// One frame (RFC 6455 §5.2, shortest length encoding), masked with `mask` if given.
pub(crate) fn write_frame(
    fin: bool,
    opcode: u8,
    mask: Option<[u8; 4]>,
    payload: &[u8],
    out: &mut Vec<u8>,
) {
    out.push(if fin { 0x80 } else { 0 } | opcode);
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(m | n as u8),
        n if n <= 0xffff => {
            out.push(m | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(m | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    let start = out.len();
    if let Some(key) = mask {
        out.extend_from_slice(&key);
    }
    let at = out.len();
    out.extend_from_slice(payload);
    if let Some(key) = mask {
        debug_assert_eq!(at - start, 4);
        apply_mask(&mut out[at..], key, 0);
    }
}

impl FrameScrubber {
    pub(crate) fn new(scrub: Replacer) -> Self {
        FrameScrubber {
            control: scrub.same_length(),
            fresh: scrub.clone(),
            message: scrub,
            in_message: None,
            state: FrameState::Head {
                bytes: [0; MAX_HEAD],
                have: 0,
            },
        }
    }

    /// Take `data` from the origin; what may go to the jail is appended to `out`.
    pub(crate) fn feed(&mut self, mut data: &[u8], out: &mut Vec<u8>) {
        while !data.is_empty() {
            match &mut self.state {
                FrameState::Stream => {
                    self.message.feed(data, out);
                    return;
                }
                FrameState::Head { bytes, have } => {
                    bytes[*have] = data[0];
                    *have += 1;
                    data = &data[1..];
                    let (bytes, have) = (*bytes, *have);
                    match parse_head(&bytes[..have]) {
                        Ok(None) => {}
                        Ok(Some((_, head))) if self.fits(head) => {
                            if head.opcode < 8 && head.opcode != 0 {
                                self.in_message = Some((head.opcode, false));
                            }
                            self.state = FrameState::Payload {
                                head,
                                left: head.len,
                                fed: 0,
                                ready: Vec::new(),
                            };
                            self.end_frame_if_done(out);
                        }
                        Ok(Some(_)) | Err(()) => {
                            // Inside a message, what its scrubber holds may begin a value whose
                            // rest would now come after these bytes: it is dropped, not sent.
                            if self.in_message.take().is_some() {
                                self.message = self.fresh.clone();
                            }
                            self.state = FrameState::Stream;
                            self.message.feed(&bytes[..have], out);
                        }
                    }
                }
                FrameState::Payload {
                    head,
                    left,
                    fed,
                    ready,
                } => {
                    let n = (*left).min(data.len() as u64) as usize;
                    let (chunk, rest) = data.split_at(n);
                    data = rest;
                    let mut plain = chunk.to_vec();
                    if let Some(key) = head.mask {
                        apply_mask(&mut plain, key, *fed);
                    }
                    if head.opcode >= 8 {
                        ready.extend_from_slice(&plain);
                    } else {
                        self.message.feed(&plain, ready);
                    }
                    *left -= n as u64;
                    *fed += n as u64;
                    let long = head.opcode < 8 && *left > 0 && ready.len() >= CHUNK;
                    if long {
                        let (head, ready) = (*head, std::mem::take(ready));
                        self.fragment(head, false, &ready, out);
                    }
                    self.end_frame_if_done(out);
                }
            }
        }
    }

    /// Whether a frame with `head` may come now: a continuation only inside a data message,
    /// a new data message only outside one, a control frame any time.
    fn fits(&self, head: Head) -> bool {
        match head.opcode {
            0 => self.in_message.is_some(),
            1 | 2 => self.in_message.is_none(),
            _ => true,
        }
    }

    /// Send `payload` as the next frame of the data message (its opcode on the first, `0` on
    /// the others), the last one when `fin`.
    fn fragment(&mut self, head: Head, fin: bool, payload: &[u8], out: &mut Vec<u8>) {
        let Some((opcode, sent)) = self.in_message else {
            return;
        };
        write_frame(fin, if sent { 0 } else { opcode }, head.mask, payload, out);
        self.in_message = (!fin).then_some((opcode, true));
    }

    /// At a payload's last byte: a control frame goes out scrubbed whole; a data frame's ready
    /// bytes go out as a fragment (all of them, the held ones replaced, when it ends the
    /// message; what may begin a value stays held for the next frame otherwise).
    fn end_frame_if_done(&mut self, out: &mut Vec<u8>) {
        let FrameState::Payload { head, left: 0, .. } = self.state else {
            return;
        };
        let FrameState::Payload { mut ready, .. } = std::mem::replace(
            &mut self.state,
            FrameState::Head {
                bytes: [0; MAX_HEAD],
                have: 0,
            },
        ) else {
            unreachable!("matched above")
        };
        if head.opcode >= 8 {
            let payload = self.control.replace_all(&ready);
            write_frame(true, head.opcode, head.mask, &payload, out);
        } else if head.fin {
            self.message.finish(&mut ready);
            self.fragment(head, true, &ready, out);
        } else if !ready.is_empty() {
            self.fragment(head, false, &ready, out);
        }
    }

    /// The origin closed: what is ready goes out; what is held (it may begin a value whose rest
    /// never came) does not, inside a message. A cut frame stays cut.
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) {
        match std::mem::replace(&mut self.state, FrameState::Stream) {
            FrameState::Head { bytes, have } => out.extend_from_slice(&bytes[..have]),
            FrameState::Payload { head, ready, .. } if head.opcode < 8 && !ready.is_empty() => {
                self.fragment(head, false, &ready, out);
            }
            FrameState::Payload { .. } => {}
            FrameState::Stream => self.message.finish(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contains;

    const REAL: &[u8] = b"sk-REALVALUE";
    const PH: &[u8] = b"sk-PLACEHOLD";

    fn scrubber() -> FrameScrubber {
        FrameScrubber::new(Replacer::new([(REAL.to_vec(), PH.to_vec())]))
    }

    /// A frame an origin sends: FIN set, `opcode`, optional mask.
    fn frame(opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut f = vec![0x80 | opcode];
        let m = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => f.push(m | n as u8),
            n if n <= 0xffff => {
                f.push(m | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(m | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mut p = payload.to_vec();
        if let Some(key) = mask {
            f.extend_from_slice(&key);
            apply_mask(&mut p, key, 0);
        }
        f.extend_from_slice(&p);
        f
    }

    /// Feed `input` in pieces of `step` bytes; what came out, and what came out only at the end.
    fn run(input: &[u8], step: usize) -> (Vec<u8>, Vec<u8>) {
        let mut s = scrubber();
        let mut out = Vec::new();
        for piece in input.chunks(step) {
            s.feed(piece, &mut out);
        }
        let mut tail = Vec::new();
        s.finish(&mut tail);
        (out, tail)
    }

    #[test]
    fn a_frame_ending_like_the_start_of_a_secret_is_released_at_its_last_byte() {
        // The bug this module exists for: "...s" could begin "sk-REALVALUE", so a stream
        // scrubber held the last byte until the next message.
        let f = frame(1, b"reply ends with s", None);
        for step in [1, 3, f.len()] {
            assert_eq!(run(&f, step), (f.clone(), vec![]), "step {step}");
        }
    }

    #[test]
    fn a_secret_inside_a_frame_is_replaced_however_the_frame_arrives() {
        let mut payload = b"key=".to_vec();
        payload.extend_from_slice(REAL);
        payload.extend_from_slice(b" end");
        let want = frame(1, &[b"key=".as_slice(), PH, b" end"].concat(), None);
        let input = [frame(1, &payload, None), frame(9, b"ping", None)].concat();
        let want = [want, frame(9, b"ping", None)].concat();
        for step in 1..=input.len() {
            assert_eq!(run(&input, step), (want.clone(), vec![]), "step {step}");
        }
    }

    #[test]
    fn masked_frames_are_unmasked_scrubbed_and_masked_again() {
        let key = [0x12, 0x34, 0x56, 0x78];
        let payload = [b"x".as_slice(), REAL, b"yz"].concat();
        let want = frame(2, &[b"x".as_slice(), PH, b"yz"].concat(), Some(key));
        let input = frame(2, &payload, Some(key));
        for step in 1..=input.len() {
            assert_eq!(run(&input, step), (want.clone(), vec![]), "step {step}");
        }
    }

    /// A frame with FIN as given (unmasked).
    fn part(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = frame(opcode, payload, None);
        if !fin {
            f[0] &= 0x7f;
        }
        f
    }

    /// The frames in `out`, each (FIN, opcode, unmasked payload); panics on a cut frame.
    fn frames(mut out: &[u8]) -> Vec<(bool, u8, Vec<u8>)> {
        let mut v = Vec::new();
        while !out.is_empty() {
            let (n, head) = parse_head(out).unwrap().expect("a whole header");
            let len = head.len as usize;
            let mut p = out[n..n + len].to_vec();
            if let Some(key) = head.mask {
                apply_mask(&mut p, key, 0);
            }
            v.push((head.fin, head.opcode, p));
            out = &out[n + len..];
        }
        v
    }

    /// Data messages (opcode, payload) and control frames (opcode, payload) in `out`.
    type Decoded = (Vec<(u8, Vec<u8>)>, Vec<(u8, Vec<u8>)>);

    /// The data messages in `out`, control frames apart.
    fn messages(out: &[u8]) -> Decoded {
        let (mut data, mut control) = (Vec::new(), Vec::new());
        let mut open: Option<(u8, Vec<u8>)> = None;
        for (fin, opcode, p) in frames(out) {
            if opcode >= 8 {
                control.push((opcode, p));
                continue;
            }
            assert_eq!(opcode == 0, open.is_some(), "frames out of sequence");
            let m = open.get_or_insert_with(|| (opcode, Vec::new()));
            m.1.extend_from_slice(&p);
            if fin {
                data.push(open.take().unwrap());
            }
        }
        assert!(open.is_none(), "an unfinished message");
        (data, control)
    }

    fn want_of(n: usize) -> Vec<u8> {
        let mut want = vec![b'a'; n];
        want[n - PH.len()..].copy_from_slice(PH);
        want
    }

    #[test]
    fn sixteen_and_sixty_four_bit_lengths() {
        for n in [126usize, 300, 70_000] {
            let mut payload = vec![b'a'; n];
            payload[n - REAL.len()..].copy_from_slice(REAL);
            let (out, tail) = run(&frame(2, &payload, None), 4096);
            assert!(tail.is_empty());
            assert_eq!(messages(&out), (vec![(2, want_of(n))], vec![]), "{n}");
            if n < CHUNK {
                assert_eq!(out, frame(2, &want_of(n), None), "{n}");
            }
        }
    }

    #[test]
    fn a_long_frame_goes_out_in_fragments_before_its_end() {
        // No stall: most of a long frame's payload is sent before its last byte arrives.
        let payload = vec![b'x'; 3 * CHUNK];
        let f = frame(1, &payload, None);
        let mut s = scrubber();
        let mut out = Vec::new();
        s.feed(&f[..f.len() - 10], &mut out);
        let sent: usize = frames(&out).iter().map(|(_, _, p)| p.len()).sum();
        assert!(sent >= 2 * CHUNK, "{sent}");
        s.feed(&f[f.len() - 10..], &mut out);
        assert_eq!(messages(&out), (vec![(1, payload)], vec![]));
    }

    #[test]
    fn a_secret_split_across_a_frame_and_its_continuation_never_reaches_the_jail() {
        let mut message = b"your key is ".to_vec();
        message.extend_from_slice(REAL);
        message.extend_from_slice(b"!");
        let want = [b"your key is ".as_slice(), PH, b"!"].concat();
        let ping = frame(9, b"sk-REAL", None);
        for at in 0..=message.len() {
            let (a, b) = message.split_at(at);
            for with_ping in [false, true] {
                let mut input = part(false, 1, a);
                if with_ping {
                    input.extend_from_slice(&ping);
                }
                input.extend_from_slice(&part(true, 0, b));
                for step in [1, 5, input.len()] {
                    let (out, tail) = run(&input, step);
                    assert!(tail.is_empty(), "at {at}");
                    let (data, control) = messages(&out);
                    assert_eq!(data, vec![(1, want.clone())], "at {at} step {step}");
                    let pings = if with_ping {
                        vec![(9, b"sk-REAL".to_vec())]
                    } else {
                        vec![]
                    };
                    assert_eq!(control, pings);
                    let payloads: Vec<u8> = frames(&out)
                        .into_iter()
                        .filter(|f| f.1 < 8)
                        .flat_map(|f| f.2)
                        .collect();
                    assert!(!contains(&payloads, REAL), "at {at}");
                }
            }
            // Control: scrubbed frame by frame, as before, the two pieces carry the value
            // whole whenever the split falls inside it.
            let per_frame: Vec<u8> = [a, b]
                .iter()
                .flat_map(|p| Replacer::new([(REAL.to_vec(), PH.to_vec())]).replace_all(p))
                .collect();
            let inside = at > 12 && at < 12 + REAL.len();
            assert_eq!(contains(&per_frame, REAL), inside, "control at {at}");
        }
    }

    #[test]
    fn a_placeholder_of_another_length_reframes_the_message() {
        let mut s = FrameScrubber::new(Replacer::new([(REAL.to_vec(), b"PH".to_vec())]));
        let mut out = Vec::new();
        let input = [part(false, 2, b"<sk-RE"), part(true, 0, b"ALVALUE>")].concat();
        s.feed(&input, &mut out);
        assert_eq!(messages(&out), (vec![(2, b"<PH>".to_vec())], vec![]));
    }

    #[test]
    fn empty_frames_and_a_cut_stream() {
        let input = [frame(1, b"", None), frame(10, b"", None)].concat();
        assert_eq!(run(&input, 1), (input.clone(), vec![]));
        // Cut inside a header: those bytes as they came.
        let f = frame(1, b"abc sk-", None);
        assert_eq!(run(&f[..1], 1), (vec![], f[..1].to_vec()));
        // Cut inside a payload that ends like a secret's start: what may begin the secret is
        // never sent.
        let (out, tail) = run(&f[..f.len() - 1], 1);
        let want = vec![(false, 1, b"abc ".to_vec())];
        assert_eq!(frames(&[out, tail].concat()), want);
        // Cut between the frames of a message: the same.
        let (out, tail) = run(&part(false, 1, b"abc sk"), 2);
        assert_eq!(frames(&[out, tail].concat()), want);
    }

    #[test]
    fn frames_out_of_sequence_fall_back_to_the_stream_scrubber() {
        // A continuation outside a message, a new message inside one.
        for input in [
            [part(true, 0, b"x"), REAL.to_vec()].concat(),
            [part(false, 1, b"a sk-RE"), part(true, 1, b"ALVALUE")].concat(),
        ] {
            let (out, tail) = run(&input, 1);
            let all = [out, tail].concat();
            assert!(
                !contains(&all, REAL) && !contains(&all, b"sk-RE"),
                "{all:?}"
            );
        }
    }

    #[test]
    fn what_is_no_frame_falls_back_to_the_stream_scrubber_and_still_replaces() {
        for head in [
            [0xc1u8, 0x05], // RSV1 (a compressed frame)
            [0x83, 0x05],   // opcode 3 is reserved
            [0x09, 0x05],   // a ping without FIN
            [0x89, 0x7e],   // a ping longer than 125
            [b'H', b'T'],   // not websocket at all
        ] {
            let input = [head.as_slice(), b"..", REAL, b"!"].concat();
            let want = [head.as_slice(), b"..", PH, b"!"].concat();
            let (out, tail) = run(&input, 1);
            assert_eq!([out, tail].concat(), want, "{head:?}");
        }
        let mut huge = vec![0x82, 0x7f];
        huge.extend_from_slice(&u64::MAX.to_be_bytes());
        huge.extend_from_slice(REAL);
        let (out, tail) = run(&huge, 5);
        assert_eq!([out, tail].concat(), [&huge[..10], PH].concat());
    }
}
