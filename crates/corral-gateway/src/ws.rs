//! What a secret-bound origin sends after a websocket `101`, scrubbed frame by frame.
//!
//! A plain stream scrubber holds back the bytes at the end of a read that could begin a real
//! value, until more data shows whether they do. On a websocket that stalls a message whose
//! last bytes look like the start of a secret until the origin's *next* message, which may
//! never come (a reply the client waits for). Here the hold-back ends with the frame: the
//! frame's length is known from its header, so once its last byte arrived the held bytes are
//! released (replaced where they match). A value split across two frames is not caught, as
//! before; one inside a frame is, however the frame arrives.
//!
//! Frames are parsed as RFC 6455 §5.2 lays them out. A masked frame (origins must not mask,
//! but may) is unmasked to be scrubbed and masked again. Anything that is not a valid frame
//! from an origin with no extension (the gateway strips `Sec-WebSocket-Extensions`), such as
//! a reserved bit, an unknown opcode or a fragmented control frame, ends frame parsing: the
//! rest of the connection goes through the plain stream scrubber, which never lets a value
//! through either, only holds back longer.

use corral_http1::io::Replacer;

/// Longest frame header: 2 bytes, a 64-bit length, a mask key.
const MAX_HEAD: usize = 14;

/// The origin-to-jail half of a spliced websocket.
pub(crate) struct FrameScrubber {
    scrub: Replacer,
    state: State,
}

enum State {
    /// Collecting a frame header.
    Head { bytes: [u8; MAX_HEAD], have: usize },
    /// Inside a frame's payload: `left` bytes to come; `fed`/`sent`: payload bytes taken in
    /// and given out so far (the mask's position on each side).
    Payload {
        left: u64,
        mask: Option<[u8; 4]>,
        fed: u64,
        sent: u64,
    },
    /// Not a websocket stream: the plain stream scrubber from here on.
    Stream,
}

/// A complete frame header: its length in bytes, the payload's length, the mask key.
type FrameHead = (usize, u64, Option<[u8; 4]>);

/// The frame header `b` begins, `None` while incomplete; `Err` when the bytes cannot begin a
/// frame an origin may send.
fn parse_head(b: &[u8]) -> Result<Option<FrameHead>, ()> {
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
    Ok(Some((need, len, mask)))
}

/// XOR `data` with `key`, starting at payload offset `at`.
fn apply_mask(data: &mut [u8], key: [u8; 4], at: u64) {
    for (i, b) in data.iter_mut().enumerate() {
        *b ^= key[((at + i as u64) % 4) as usize];
    }
}

impl FrameScrubber {
    /// `scrub` must keep lengths ([`Replacer::same_length`]): frame lengths are not rewritten.
    pub(crate) fn new(scrub: Replacer) -> Self {
        debug_assert!(scrub.preserves_length());
        FrameScrubber {
            scrub,
            state: State::Head {
                bytes: [0; MAX_HEAD],
                have: 0,
            },
        }
    }

    /// Take `data` from the origin; what may go to the jail is appended to `out`.
    pub(crate) fn feed(&mut self, mut data: &[u8], out: &mut Vec<u8>) {
        while !data.is_empty() {
            match &mut self.state {
                State::Stream => {
                    self.scrub.feed(data, out);
                    return;
                }
                State::Head { bytes, have } => {
                    bytes[*have] = data[0];
                    *have += 1;
                    data = &data[1..];
                    match parse_head(&bytes[..*have]) {
                        Ok(None) => {}
                        Ok(Some((n, left, mask))) => {
                            out.extend_from_slice(&bytes[..n]);
                            self.state = State::Payload {
                                left,
                                mask,
                                fed: 0,
                                sent: 0,
                            };
                            self.end_frame_if_done(out);
                        }
                        Err(()) => {
                            let seen = bytes[..*have].to_vec();
                            self.state = State::Stream;
                            self.scrub.feed(&seen, out);
                        }
                    }
                }
                State::Payload {
                    left,
                    mask,
                    fed,
                    sent,
                } => {
                    let n = (*left).min(data.len() as u64) as usize;
                    let (chunk, rest) = data.split_at(n);
                    data = rest;
                    let start = out.len();
                    match mask {
                        Some(key) => {
                            let mut plain = chunk.to_vec();
                            apply_mask(&mut plain, *key, *fed);
                            self.scrub.feed(&plain, out);
                            apply_mask(&mut out[start..], *key, *sent);
                        }
                        None => self.scrub.feed(chunk, out),
                    }
                    *left -= n as u64;
                    *fed += n as u64;
                    *sent += (out.len() - start) as u64;
                    self.end_frame_if_done(out);
                }
            }
        }
    }

    /// At a payload's last byte: the held-back bytes go out and the next header begins.
    fn end_frame_if_done(&mut self, out: &mut Vec<u8>) {
        let State::Payload {
            left: 0,
            mask,
            sent,
            ..
        } = self.state
        else {
            return;
        };
        self.release(mask, sent, out);
        self.state = State::Head {
            bytes: [0; MAX_HEAD],
            have: 0,
        };
    }

    /// The origin closed: whatever is still held goes out (a cut frame stays cut).
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) {
        match std::mem::replace(&mut self.state, State::Stream) {
            State::Head { bytes, have } => out.extend_from_slice(&bytes[..have]),
            State::Payload { mask, sent, .. } => self.release(mask, sent, out),
            State::Stream => self.scrub.finish(out),
        }
    }

    /// The payload bytes held back, replaced where they match, masked again from payload
    /// offset `sent` when the frame is.
    fn release(&mut self, mask: Option<[u8; 4]>, sent: u64, out: &mut Vec<u8>) {
        let start = out.len();
        self.scrub.finish(out);
        if let Some(key) = mask {
            apply_mask(&mut out[start..], key, sent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REAL: &[u8] = b"sk-REALVALUE";
    const PH: &[u8] = b"sk-PLACEHOLD";

    fn scrubber() -> FrameScrubber {
        FrameScrubber::new(Replacer::new([(REAL.to_vec(), PH.to_vec())]).same_length())
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

    #[test]
    fn sixteen_and_sixty_four_bit_lengths() {
        for n in [126usize, 300, 70_000] {
            let mut payload = vec![b'a'; n];
            payload[n - REAL.len()..].copy_from_slice(REAL);
            let mut want = vec![b'a'; n];
            want[n - PH.len()..].copy_from_slice(PH);
            let (out, tail) = run(&frame(2, &payload, None), 4096);
            assert_eq!((out, tail), (frame(2, &want, None), vec![]), "{n}");
        }
    }

    #[test]
    fn empty_frames_and_a_cut_stream() {
        let input = [frame(1, b"", None), frame(10, b"", None)].concat();
        assert_eq!(run(&input, 1), (input.clone(), vec![]));
        // Cut inside a header, and inside a payload that ends like a secret's start.
        let f = frame(1, b"abc sk-", None);
        assert_eq!(run(&f[..1], 1), (vec![], f[..1].to_vec()));
        let (out, tail) = run(&f[..f.len() - 1], 1);
        assert_eq!([out, tail].concat(), f[..f.len() - 1].to_vec());
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
