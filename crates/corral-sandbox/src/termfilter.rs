//! What the jail writes to the user's terminal, without the sequences that act outside the
//! jail's own screen.
//!
//! A terminal obeys escape sequences from whatever it displays, and some of them reach beyond
//! the screen: OSC 52 writes (or reads) the desktop clipboard, OSC 1337 `File=` and kitty's
//! graphics protocol read host files, OSC 50 changes fonts, DECUDK programs the terminal's
//! function keys for the shell that comes after the jail, CSI `t` moves and resizes the window,
//! media copy (`CSI 5 i`) pipes output to a printer command. corral relays the jail's output
//! through [`OutputFilter`], which passes text and screen sequences unchanged and drops:
//!
//! - OSC sequences except 0-2 (titles), 7 (working directory), 8 (hyperlinks), 22 (pointer
//!   shape), 133 (prompt marks) and colour queries (below); OSC 52 clipboard writes pass with
//!   `terminal.clipboard = true`, clipboard reads never;
//! - colour changes: OSC 4 and 5 (the palette) and 10-19 (the default foreground, background,
//!   cursor, ... colours) pass only when every colour they name is asked for (`?`: a TUI
//!   asking whether the background is dark); one that sets a colour, and the resets 104, 105
//!   and 110-119, are dropped. A colour the jail set would outlast it in the user's terminal
//!   (nothing but a reset undoes it, and a reset also undoes the palette the user's own shell
//!   set: base16, pywal), and a foreground set to the background hides what corral says
//!   after the run;
//! - DCS with final `|` (DECUDK: user-defined keys), `t` (tmux passthrough, `DCS tmux;`) and
//!   `+p` (XTSETTCAP); other DCS (sixel, DECRQSS, XTGETTCAP) pass;
//! - APC, PM and SOS strings (kitty graphics reads files and shared memory by name);
//! - CSI `t` other than the reports and title stack (11-23), and CSI `i` (media copy);
//! - every C1 control, raw (0x80-0x9f outside a UTF-8 character) or UTF-8 encoded
//!   (U+0080-U+009F), so no 8-bit introducer reaches a terminal that honours one;
//! - a doubled ESC's first ESC (a no-op for terminals; tmux's passthrough un-doubles it).
//!
//! The filter is a streaming state machine: a sequence split across reads is recognised the
//! same, and a sequence whose verdict is not known yet is held (a few bytes) until it is. Any
//! ESC ends a string as terminals do, so nothing inside a passed string can hide an
//! introducer from the filter.

/// OSC numbers that act on the jail's screen only.
const OSC_PASS: &[u32] = &[0, 1, 2, 7, 8, 22, 133];
const OSC_CLIPBOARD: u32 = 52;

/// How an OSC number acts on the terminal's colours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Colour {
    /// OSC 4 and 5: pairs of a colour's index and its spec (`?` asks for it).
    Indexed,
    /// OSC 10-19: a spec for this colour and for each that follows (`?` asks for it).
    Dynamic,
    /// OSC 104, 105, 110-119: back to the terminal's default.
    Reset,
}

fn colour_osc(number: u32) -> Option<Colour> {
    match number {
        4 | 5 => Some(Colour::Indexed),
        10..=19 => Some(Colour::Dynamic),
        104 | 105 | 110..=119 => Some(Colour::Reset),
        _ => None,
    }
}

/// Does the data of a colour OSC (after its number's `;`) only ask, changing no colour?
fn asks_only(kind: Colour, data: &[u8]) -> bool {
    let fields: Vec<&[u8]> = data.split(|&b| b == b';').collect();
    match kind {
        Colour::Indexed => {
            fields.len().is_multiple_of(2)
                && fields
                    .chunks(2)
                    .all(|pair| !pair[0].is_empty() && pair[1] == b"?")
        }
        Colour::Dynamic => fields.iter().all(|f| *f == b"?"),
        Colour::Reset => false,
    }
}

const ESC: u8 = 0x1b;
const BEL: u8 = 0x07;
const CAN: u8 = 0x18;
const SUB: u8 = 0x1a;
/// Longest header (CSI parameters, DCS parameters, OSC number and clipboard selection) held
/// while deciding; a longer one is dropped whole.
const MAX_HELD: usize = 256;

/// Which control string is open, which decides what ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StringKind {
    /// OSC: BEL ends it too.
    Osc,
    /// DCS, APC, PM, SOS: only ST (or any ESC, CAN, SUB).
    Other,
}

/// Where the filter is in an escape sequence, carried from one chunk of output to the next.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ParseState {
    Ground,
    /// ESC seen and held.
    Esc,
    /// ESC and intermediate bytes, passed; until the final byte.
    EscIntermediate,
    /// `ESC [` and parameters held until the final byte.
    Csi,
    /// A CSI too long to hold: dropped to its final byte.
    CsiDrop,
    /// `ESC ]` and the OSC number held.
    OscNumber,
    /// `ESC ] 52 ;` and the selection held (clipboard writes allowed): until the data's first
    /// byte says whether it is a read (`?`).
    OscClipboard {
        semicolons: u8,
    },
    /// A colour OSC held whole (`ESC ] N ;` and its data) until its end says whether it only
    /// asks; `esc`: an ESC was seen last.
    OscColour {
        kind: Colour,
        esc: bool,
    },
    /// `ESC P` and the DCS header held until its final byte.
    DcsHeader,
    /// A string being passed.
    Pass(StringKind),
    /// ESC inside a passed string: `\` completes the ST (passed); anything else ended the
    /// string, which the filter closes with an ST of its own.
    PassEsc,
    /// A string being dropped.
    Drop(StringKind),
    /// ESC inside a dropped string: `\` completes the ST (dropped too).
    DropEsc,
}

/// How many sequences a filter dropped, for the end-of-run report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Dropped {
    /// OSC 52 clipboard writes and reads.
    pub clipboard: u64,
    /// Every other sequence that acts outside the screen (C1 bytes not counted: a binary file
    /// printed to the terminal is full of them).
    pub other: u64,
    /// Colour changes (the palette, the default colours) and resets.
    #[serde(default)]
    pub colours: u64,
}

impl Dropped {
    pub fn add(&mut self, o: Dropped) {
        self.clipboard += o.clipboard;
        self.other += o.other;
        self.colours += o.colours;
    }

    /// The end-of-run lines, with the fix; none when nothing was dropped.
    pub fn summary(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.clipboard > 0 {
            out.push(format!(
                "the jail's output held {} clipboard sequence(s) (OSC 52), not passed to your \
                 terminal; to let clipboard writes through, set `[terminal] clipboard = true` in \
                 your config (reads never pass)",
                self.clipboard
            ));
        }
        if self.colours > 0 {
            out.push(format!(
                "the jail's output held {} colour change(s) (the palette, the default colours), \
                 not passed to your terminal, where they would outlast the jail",
                self.colours
            ));
        }
        if self.other > 0 {
            out.push(format!(
                "the jail's output held {} escape sequence(s) that act outside the screen (files, \
                 fonts, keys, the window, notifications), not passed to your terminal",
                self.other
            ));
        }
        out
    }
}

/// The jail's output filter. Feed it with [`OutputFilter::push`].
#[derive(Debug)]
pub struct OutputFilter {
    clipboard: bool,
    dropped: Dropped,
    state: ParseState,
    /// Bytes of the sequence being decided.
    held: Vec<u8>,
    /// UTF-8 continuation bytes still expected in the current character.
    utf8_left: u8,
    /// A held 0xC2 (the lead byte of U+0080-U+00BF): the next byte says whether it is a C1.
    lead_c2: bool,
}

impl OutputFilter {
    /// `clipboard`: pass OSC 52 clipboard writes (`terminal.clipboard` of the Plan).
    pub fn new(clipboard: bool) -> OutputFilter {
        OutputFilter {
            clipboard,
            dropped: Dropped::default(),
            state: ParseState::Ground,
            held: Vec::new(),
            utf8_left: 0,
            lead_c2: false,
        }
    }

    /// What it dropped so far.
    pub fn dropped(&self) -> Dropped {
        self.dropped
    }

    /// Whether what the filter passed so far ends between sequences and characters: not inside
    /// an escape sequence or string (passed or held) nor a UTF-8 character. Bytes of corral's
    /// own written to the terminal here cannot cut or join anything of the jail's.
    pub fn at_boundary(&self) -> bool {
        self.state == ParseState::Ground && self.utf8_left == 0 && !self.lead_c2
    }

    /// Filter `input`, appending what may reach the terminal to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        for &b in input {
            self.c1_layer(b, out);
        }
    }

    /// First layer: drop C1 controls, raw or UTF-8 encoded; pass everything else on.
    fn c1_layer(&mut self, b: u8, out: &mut Vec<u8>) {
        if self.lead_c2 {
            self.lead_c2 = false;
            if (0x80..=0x9f).contains(&b) {
                return; // U+0080-U+009F: a C1 control.
            }
            self.escape_layer(0xc2, out);
            self.utf8_left = 0;
            if (0xa0..=0xbf).contains(&b) {
                self.escape_layer(b, out);
                return;
            }
        }
        match b {
            0x80..=0xbf if self.utf8_left > 0 => {
                self.utf8_left -= 1;
                self.escape_layer(b, out);
            }
            0x80..=0x9f => {} // raw C1 outside a character
            0xc2 => self.lead_c2 = true,
            _ => {
                self.utf8_left = match b {
                    0xc3..=0xdf => 1,
                    0xe0..=0xef => 2,
                    0xf0..=0xf4 => 3,
                    _ => 0,
                };
                self.escape_layer(b, out);
            }
        }
    }

    /// Second layer: 7-bit escape sequences.
    fn escape_layer(&mut self, b: u8, out: &mut Vec<u8>) {
        match self.state.clone() {
            ParseState::Ground => self.ground(b, out),
            ParseState::Esc => self.after_esc(b, out),
            ParseState::EscIntermediate => {
                if b == ESC {
                    return self.start_esc();
                }
                out.push(b);
                if !(0x20..=0x2f).contains(&b) {
                    self.state = ParseState::Ground;
                }
            }
            ParseState::Csi => self.csi(b, out),
            ParseState::CsiDrop => {
                if b == ESC {
                    return self.start_esc();
                }
                if (0x40..=0x7e).contains(&b) || b == CAN || b == SUB {
                    self.state = ParseState::Ground;
                }
            }
            ParseState::OscNumber => self.osc_number(b, out),
            ParseState::OscClipboard { semicolons } => self.osc_clipboard(b, semicolons, out),
            ParseState::OscColour { kind, esc } => self.osc_colour(b, kind, esc, out),
            ParseState::DcsHeader => self.dcs_header(b, out),
            ParseState::Pass(kind) => match b {
                ESC => self.state = ParseState::PassEsc,
                CAN | SUB => {
                    out.push(b);
                    self.state = ParseState::Ground;
                }
                BEL if kind == StringKind::Osc => {
                    out.push(b);
                    self.state = ParseState::Ground;
                }
                _ => out.push(b),
            },
            ParseState::PassEsc => {
                out.extend_from_slice(b"\x1b\\");
                if b == b'\\' {
                    self.state = ParseState::Ground;
                } else {
                    self.start_esc();
                    self.after_esc(b, out);
                }
            }
            ParseState::Drop(kind) => match b {
                ESC => self.state = ParseState::DropEsc,
                CAN | SUB => self.state = ParseState::Ground,
                BEL if kind == StringKind::Osc => self.state = ParseState::Ground,
                _ => {}
            },
            ParseState::DropEsc => {
                if b == b'\\' {
                    self.state = ParseState::Ground;
                } else {
                    self.start_esc();
                    self.after_esc(b, out);
                }
            }
        }
    }

    fn start_esc(&mut self) {
        self.held.clear();
        self.held.push(ESC);
        self.state = ParseState::Esc;
    }

    fn ground(&mut self, b: u8, out: &mut Vec<u8>) {
        if b == ESC {
            self.start_esc();
        } else {
            out.push(b);
        }
    }

    fn after_esc(&mut self, b: u8, out: &mut Vec<u8>) {
        match b {
            // A doubled ESC: the first one does nothing on a terminal; dropped.
            ESC => self.start_esc(),
            b'[' => {
                self.held.push(b);
                self.state = ParseState::Csi;
            }
            b']' => {
                self.held.push(b);
                self.state = ParseState::OscNumber;
            }
            b'P' => {
                self.held.push(b);
                self.state = ParseState::DcsHeader;
            }
            b'X' | b'^' | b'_' => {
                self.dropped.other += 1;
                self.state = ParseState::Drop(StringKind::Other);
            }
            // A string terminator outside a string (one whose string was dropped): a no-op.
            b'\\' => self.state = ParseState::Ground,
            CAN | SUB => {
                out.push(b);
                self.state = ParseState::Ground;
            }
            0x20..=0x2f => {
                out.extend_from_slice(&[ESC, b]);
                self.state = ParseState::EscIntermediate;
            }
            _ => {
                out.extend_from_slice(&[ESC, b]);
                self.state = ParseState::Ground;
            }
        }
    }

    fn csi(&mut self, b: u8, out: &mut Vec<u8>) {
        match b {
            ESC => self.start_esc(),
            CAN | SUB => {
                out.push(b);
                self.state = ParseState::Ground;
            }
            // C0 controls inside a CSI are executed by terminals as they come.
            0x00..=0x1f => out.push(b),
            0x40..=0x7e => {
                self.held.push(b);
                if csi_allowed(&self.held[2..]) {
                    out.extend_from_slice(&self.held);
                } else {
                    self.dropped.other += 1;
                }
                self.state = ParseState::Ground;
            }
            _ if self.held.len() >= MAX_HELD => {
                self.dropped.other += 1;
                self.state = ParseState::CsiDrop;
            }
            _ => self.held.push(b),
        }
    }

    fn osc_number(&mut self, b: u8, out: &mut Vec<u8>) {
        if b.is_ascii_digit() && self.held.len() < 12 {
            self.held.push(b);
            return;
        }
        let number = std::str::from_utf8(&self.held[2..])
            .ok()
            .filter(|d| !d.is_empty() && d.len() < 12)
            .and_then(|d| d.parse::<u32>().ok());
        let pass = number.is_some_and(|n| OSC_PASS.contains(&n));
        if let Some(kind) = number.and_then(colour_osc) {
            if b == b';' {
                self.held.push(b);
                self.state = ParseState::OscColour { kind, esc: false };
            } else {
                // Ended (or broken) at its number: a reset of every colour, or nothing.
                self.dropped.colours += 1;
                self.state = ParseState::Drop(StringKind::Osc);
                self.escape_layer(b, out);
            }
            return;
        }
        if number == Some(OSC_CLIPBOARD) && self.clipboard && b == b';' {
            self.held.push(b);
            self.state = ParseState::OscClipboard { semicolons: 1 };
            return;
        }
        if pass {
            out.extend_from_slice(&self.held);
            self.state = ParseState::Pass(StringKind::Osc);
            self.escape_layer(b, out);
        } else {
            if number == Some(OSC_CLIPBOARD) {
                self.dropped.clipboard += 1;
            } else {
                self.dropped.other += 1;
            }
            self.state = ParseState::Drop(StringKind::Osc);
            self.escape_layer(b, out);
        }
    }

    /// `ESC ] 52 ; Pc ; Pd`: a write passes, a read (`Pd` = `?`) is dropped.
    fn osc_clipboard(&mut self, b: u8, semicolons: u8, out: &mut Vec<u8>) {
        match (semicolons, b) {
            (_, ESC | BEL | CAN | SUB) => {
                // Ended (or broken) before any data: nothing for the terminal to do.
                self.state = ParseState::Drop(StringKind::Osc);
                self.escape_layer(b, out);
            }
            (1, b';') => {
                self.held.push(b);
                self.state = ParseState::OscClipboard { semicolons: 2 };
            }
            (1, _) if self.held.len() < MAX_HELD => self.held.push(b),
            (1, _) | (_, b'?') => {
                self.dropped.clipboard += 1;
                self.state = ParseState::Drop(StringKind::Osc);
            }
            _ => {
                out.extend_from_slice(&self.held);
                out.push(b);
                self.state = ParseState::Pass(StringKind::Osc);
            }
        }
    }

    /// A colour OSC, held whole: passed at its end when it only asks ([`asks_only`]), with the
    /// terminator it came with; dropped otherwise, as is one too long to hold.
    fn osc_colour(&mut self, b: u8, kind: Colour, esc: bool, out: &mut Vec<u8>) {
        let end: &[u8] = match (esc, b) {
            (true, b'\\') => b"\x1b\\",
            (true, _) => {
                // An ESC ended the string (terminals act on it then): decided as ended with ST,
                // then the ESC starts what follows.
                self.end_colour(kind, b"\x1b\\", out);
                self.start_esc();
                return self.after_esc(b, out);
            }
            (false, BEL) => b"\x07",
            (false, ESC) => {
                self.state = ParseState::OscColour { kind, esc: true };
                return;
            }
            (false, CAN | SUB) => {
                // Aborted: the terminal does nothing with it.
                self.state = ParseState::Ground;
                return;
            }
            (false, _) if self.held.len() >= MAX_HELD => {
                self.dropped.colours += 1;
                self.state = ParseState::Drop(StringKind::Osc);
                return;
            }
            (false, _) => {
                self.held.push(b);
                return;
            }
        };
        self.end_colour(kind, end, out);
    }

    fn end_colour(&mut self, kind: Colour, end: &[u8], out: &mut Vec<u8>) {
        let data_at = self
            .held
            .iter()
            .position(|&c| c == b';')
            .map_or(self.held.len(), |i| i + 1);
        if asks_only(kind, &self.held[data_at..]) {
            out.extend_from_slice(&self.held);
            out.extend_from_slice(end);
        } else {
            self.dropped.colours += 1;
        }
        self.state = ParseState::Ground;
    }

    fn dcs_header(&mut self, b: u8, out: &mut Vec<u8>) {
        match b {
            ESC | CAN | SUB => {
                self.state = ParseState::Drop(StringKind::Other);
                self.escape_layer(b, out);
            }
            0x40..=0x7e => {
                let header = &self.held[2..];
                let drop = b == b'|' || b == b't' || (b == b'p' && header.contains(&b'+'));
                if drop {
                    self.dropped.other += 1;
                    self.state = ParseState::Drop(StringKind::Other);
                } else {
                    out.extend_from_slice(&self.held);
                    out.push(b);
                    self.state = ParseState::Pass(StringKind::Other);
                }
            }
            _ if self.held.len() >= MAX_HELD => {
                self.dropped.other += 1;
                self.state = ParseState::Drop(StringKind::Other);
            }
            _ => self.held.push(b),
        }
    }
}

/// A complete CSI (its bytes after `ESC [`, final byte last) that acts on the screen only.
fn csi_allowed(body: &[u8]) -> bool {
    let (&last, params) = body.split_last().expect("a CSI has a final byte");
    match last {
        // Media copy: to the printer (xterm's printerCommand runs on the host).
        b'i' => false,
        // Window manipulation: allowed are the reports (11-21) and the title stack (22, 23),
        // and the private forms (`CSI > ... t`: title modes).
        b't' => {
            if params.first().is_some_and(|c| (b'<'..=b'?').contains(c)) {
                return true;
            }
            let first: String = params
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .map(|&c| c as char)
                .collect();
            first.parse::<u32>().is_ok_and(|n| (11..=23).contains(&n))
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(clipboard: bool, input: &[u8]) -> Vec<u8> {
        let mut f = OutputFilter::new(clipboard);
        let mut out = Vec::new();
        f.push(input, &mut out);
        out
    }

    /// The same input, fed one byte at a time, gives the same output.
    fn filter_bytewise(clipboard: bool, input: &[u8]) -> Vec<u8> {
        let mut f = OutputFilter::new(clipboard);
        let mut out = Vec::new();
        for b in input {
            f.push(std::slice::from_ref(b), &mut out);
        }
        out
    }

    fn check(clipboard: bool, input: &[u8], expected: &[u8]) {
        let whole = filter(clipboard, input);
        assert_eq!(
            String::from_utf8_lossy(&whole),
            String::from_utf8_lossy(expected),
            "input {:?}",
            String::from_utf8_lossy(input)
        );
        assert_eq!(
            whole,
            filter_bytewise(clipboard, input),
            "split reads differ"
        );
    }

    #[test]
    fn text_and_screen_sequences_pass_unchanged() {
        let screen: &[u8] = b"plain \xc3\xa9t\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x98\x80 \xc2\xa9\r\n\
            \x1b[1;31mred\x1b[0m \x1b[?1049h\x1b[2J\x1b[H\x1b(B\x1b7\x1b8\x1bM\
            \x1b]0;title\x07\x1b]2;t\x1b\\\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\\
            \x1b]11;?\x07\x1b]4;1;?\x07\x1b]10;?;?\x1b\\\x1b]133;A\x07\
            \x1bPq#0;2;0;0;0#0!10~\x1b\\\x1bP$qm\x1b\\\x1b[21t\x1b[22;0t\x1b[>0;1t\x07\x08\t";
        check(false, screen, screen);
    }

    #[test]
    fn colour_queries_pass_and_colour_changes_are_dropped() {
        for asks in [
            &b"\x1b]11;?\x07"[..],
            b"\x1b]10;?\x1b\\",
            b"\x1b]10;?;?;?\x07",
            b"\x1b]4;1;?\x07",
            b"\x1b]4;1;?;15;?\x1b\\",
            b"\x1b]5;0;?\x07",
        ] {
            check(false, asks, asks);
        }
        for sets in [
            &b"\x1b]4;1;rgb:ff/00/00\x07"[..],
            b"\x1b]4;1;?;2;#000000\x07",   // a query hiding a change
            b"\x1b]4;1\x07",               // an index without a spec
            b"\x1b]10;#000000\x07",        // the foreground
            b"\x1b]11;rgb:00/00/00\x1b\\", // the background
            b"\x1b]10;?;#000000\x07",      // the background, after a query of the foreground
            b"\x1b]12;red\x07",            // the cursor
            b"\x1b]104\x07",               // every palette colour reset
            b"\x1b]104;1;2\x1b\\",
            b"\x1b]110\x07",
            b"\x1b]111;\x07",
            b"\x1b]119\x1b\\",
        ] {
            let mut input = b"<".to_vec();
            input.extend_from_slice(sets);
            input.extend_from_slice(b">");
            check(false, &input, b"<>");
        }
        // Ended by an ESC that starts the next sequence: decided at the ESC.
        check(false, b"\x1b]11;?\x1b[1m", b"\x1b]11;?\x1b\\\x1b[1m");
        check(false, b"\x1b]11;#fff\x1b[1m", b"\x1b[1m");
        // Aborted, or too long to hold: nothing.
        check(false, b"\x1b]11;?\x18x", b"x");
        let mut long = b"\x1b]4;1;?".to_vec();
        long.extend(std::iter::repeat_n(b';', 300));
        long.extend_from_slice(b"\x07x");
        check(false, &long, b"x");
        let mut f = OutputFilter::new(false);
        let mut out = Vec::new();
        f.push(b"\x1b]10;#000\x07\x1b]104\x07\x1b]11;?\x07", &mut out);
        assert_eq!(f.dropped().colours, 2);
    }

    #[test]
    fn clipboard_writes_and_reads_are_dropped_by_default() {
        check(false, b"a\x1b]52;c;SGVsbG8=\x07b", b"ab");
        check(false, b"a\x1b]52;c;SGVsbG8=\x1b\\b", b"ab");
        check(false, b"a\x1b]52;;SGVsbG8=\x1b\\b", b"ab");
        check(false, b"a\x1b]52;c;?\x07b", b"ab");
        // 8-bit and UTF-8 encoded C1 introducers and terminators.
        check(false, b"a\x9d52;c;SGVsbG8=\x9cb", b"a52;c;SGVsbG8=b");
        check(
            false,
            b"a\xc2\x9d52;c;SGVsbG8=\xc2\x9cb",
            b"a52;c;SGVsbG8=b",
        );
        // Not mistaken for C1: the same bytes inside UTF-8 characters.
        check(false, "é→ȝ".as_bytes(), "é→ȝ".as_bytes());
    }

    #[test]
    fn clipboard_writes_pass_when_allowed_but_reads_never() {
        let write = b"\x1b]52;c;SGVsbG8=\x07";
        check(true, write, write);
        check(true, b"\x1b]52;;SGVsbG8=\x1b\\", b"\x1b]52;;SGVsbG8=\x1b\\");
        check(true, b"a\x1b]52;c;?\x07b", b"ab");
        check(true, b"a\x1b]52;c;?\x1b\\b", b"ab");
    }

    #[test]
    fn host_acting_sequences_are_dropped() {
        for seq in [
            &b"\x1b]50;font\x07"[..],                      // font
            b"\x1b]1337;File=name=eA==;inline=0:AAAA\x07", // iTerm2 file download
            b"\x1b]1337;RemoteHost=u@h\x07",
            b"\x1b]5113;ac=send;id=1\x1b\\", // kitty file transfer
            b"\x1b]9;notify me\x07",         // notifications
            b"\x1b]777;notify;a;b\x07",
            b"\x1b]99;;hi\x1b\\",
            b"\x1b]46;/tmp/log\x07", // xterm log file
            b"\x1b]3;WM_NAME=x\x07", // X property
            b"\x1b]L;icon\x1b\\",
            b"\x1b_Ga=T,t=f;L2V0Yy9wYXNzd2Q=\x1b\\", // kitty graphics from a file
            b"\x1b^private\x1b\\",
            b"\x1bXsos\x1b\\",
            b"\x1bP0;1|17/73746172\x1b\\", // DECUDK: F6 types a command
            b"\x1bPtmux;\x1b\x1b]52;c;SGVsbG8=\x07\x1b\\", // tmux passthrough
            b"\x1bP+p544e\x1b\\",          // XTSETTCAP
            b"\x1b[3;0;0t",                // move the window
            b"\x1b[8;100;300t",            // resize it
            b"\x1b[2t",                    // iconify
            b"\x1b[48t",                   // DECSLPP
            b"\x1b[5i",                    // printer controller on
            b"\x1b[?5i",
        ] {
            let mut input = b"<".to_vec();
            input.extend_from_slice(seq);
            input.extend_from_slice(b">");
            check(false, &input, b"<>");
        }
    }

    #[test]
    fn an_escape_ends_every_string_so_nothing_hides_inside_one() {
        // A title whose text holds an OSC 52: the title ends at the ESC, the OSC 52 is dropped.
        check(
            false,
            b"\x1b]0;t\x1b]52;c;SGVsbG8=\x07x",
            b"\x1b]0;t\x1b\\x",
        );
        // A DCS that GNU screen would pass through, holding an OSC 52.
        check(false, b"\x1bP\x1b]52;c;SGVsbG8=\x07\x1b\\x", b"x");
        // A doubled ESC loses its first half (tmux's passthrough needs it doubled).
        check(false, b"\x1b\x1b[1m", b"\x1b[1m");
        // CAN aborts a held sequence.
        check(false, b"\x1b]52;c\x18x", b"x");
    }

    #[test]
    fn what_was_dropped_is_counted_for_the_report() {
        let mut f = OutputFilter::new(false);
        let mut out = Vec::new();
        f.push(
            b"\x1b]52;c;QQ==\x07\x1b]52;c;?\x07\x1b]50;f\x07\x1b_Gx\x1b\\\x1b[2t\x9d\x1b]0;t\x07",
            &mut out,
        );
        assert_eq!(
            f.dropped(),
            Dropped {
                clipboard: 2,
                other: 3,
                colours: 0,
            }
        );
        assert_eq!(f.dropped().summary().len(), 2);
        assert!(f.dropped().summary()[0].contains("[terminal] clipboard = true"));
        assert!(Dropped::default().summary().is_empty());
    }

    #[test]
    fn a_boundary_is_only_between_sequences_and_characters() {
        // After each prefix of this stream: whether the filter is at a boundary.
        let stream: &[u8] =
            b"a\x1b[1;31mb\x1b]0;ti\x07\xc3\xa9\xe2\x86\x92\x1b(B\x1bPq#0\x1b\\\x1b7\xc2\xa9.";
        let boundaries: Vec<usize> = (0..=stream.len())
            .filter(|&cut| {
                let mut f = OutputFilter::new(false);
                f.push(&stream[..cut], &mut Vec::new());
                f.at_boundary()
            })
            .collect();
        // Start, after `a`, the SGR, `b`, the title's BEL, `é`, `→`, `ESC ( B`, the DCS's ST,
        // `ESC 7`, `©` and `.`.
        assert_eq!(boundaries, vec![0, 1, 8, 9, 16, 18, 21, 24, 31, 33, 35, 36]);
    }

    #[test]
    fn a_sequence_split_anywhere_is_filtered_the_same() {
        let input: &[u8] =
            b"ok\x1b]52;c;SGVsbG8=\x1b\\\xc2\x9d52;x\x07\x1b]0;t\x07\xc3\xa9\x1b[31m!";
        let whole = filter(false, input);
        for cut in 0..input.len() {
            let mut f = OutputFilter::new(false);
            let mut out = Vec::new();
            f.push(&input[..cut], &mut out);
            f.push(&input[cut..], &mut out);
            assert_eq!(out, whole, "cut at {cut}");
        }
        assert_eq!(whole, b"ok52;x\x07\x1b]0;t\x07\xc3\xa9\x1b[31m!".to_vec());
    }
}
