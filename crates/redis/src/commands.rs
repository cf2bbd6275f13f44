//! Where a client's command stream is, command by command: the router tells
//! each command's size from its headers before the server reads it, so one
//! over [`LIMIT`] is refused with an error reply the client can read. Redis
//! itself would take it into its client memory and then close the
//! connection, with no reply at all.
//!
//! Only headers are looked at: a bulk string's bytes are passed on as they
//! come. Headers are read exactly as Redis reads them, so the two never
//! disagree on where a command ends; a stream Redis would refuse (and close)
//! is passed on unjudged from there, for the server to refuse.

/// The most bytes one command may take (headers, arguments and their line ends).
pub const LIMIT: u64 = crate::server::MAX_COMMAND;

/// The longest header line (`*N` or `$N` and its CRLF) the framer waits for:
/// room for any number `string2ll` reads.
const MAX_HEADER: usize = 24;

/// What the next bytes of the stream are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The next `n` bytes (at least one) are judged: pass them on.
    Pass(usize),
    /// The array header of `n` bytes that starts here begins a command.
    Start(usize),
    /// The bulk header of `n` bytes that starts here announces an argument of
    /// `bytes` bytes (its CRLF included), and its command is within the limit so far.
    Argument { n: usize, bytes: u64 },
    /// A header line starts here and is not complete yet: keep these bytes
    /// and read more before asking again.
    Wait,
    /// The bulk header of `n` bytes that starts here takes its command over
    /// the limit, to `size` bytes in all. The framer goes on as if it had
    /// been passed, so the rest of the command can be read and dropped.
    Over { n: usize, size: u64 },
}

/// A client's command stream, between and inside commands.
#[derive(Debug)]
pub struct Commands {
    at: At,
    limit: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// The next byte starts a command.
    Between,
    /// Inside an inline command (words on one line), until its newline.
    Inline,
    /// Inside an array command, before the header of one of its `left` arguments.
    Argument { left: u64, size: u64 },
    /// Inside a bulk string: `bytes` remain (its CRLF included), then `left` arguments.
    Bulk { bytes: u64, left: u64, size: u64 },
    /// Past something the framer does not understand: all of it passes.
    Unjudged,
}

impl Commands {
    /// A stream that starts between commands, judged against `limit` bytes a command.
    pub fn new(limit: u64) -> Self {
        Self { at: At::Between, limit }
    }

    /// Whether the stream is still judged (not past something Redis refuses).
    pub fn judging(&self) -> bool {
        self.at != At::Unjudged
    }

    /// Whether the stream is between commands (a refused command has been read to its end).
    pub fn between(&self) -> bool {
        self.at == At::Between
    }

    /// Judges the start of `input` (not empty).
    pub fn step(&mut self, input: &[u8]) -> Step {
        debug_assert!(!input.is_empty());
        match self.at {
            At::Unjudged => Step::Pass(input.len()),
            // Redis looks for an inline command's end with `strchr`, which a
            // NUL byte stops: it then waits for more, never for this line's end.
            At::Inline => match input.iter().position(|&b| b == b'\n' || b == 0) {
                Some(end) if input[end] == 0 => self.unjudged(input),
                Some(end) => {
                    self.at = At::Between;
                    Step::Pass(end + 1)
                }
                None => Step::Pass(input.len()),
            },
            At::Bulk { bytes, left, size } => {
                let n = bytes.min(input.len() as u64);
                self.at = if n == bytes {
                    Self::after_argument(left, size)
                } else {
                    At::Bulk { bytes: bytes - n, left, size }
                };
                Step::Pass(n as usize)
            }
            At::Between if input[0] != b'*' => {
                self.at = At::Inline;
                self.step(input)
            }
            At::Between => match header(input, b'*') {
                Header::Incomplete => Step::Wait,
                Header::Bad => self.unjudged(input),
                // Past INT_MAX arguments Redis refuses the command.
                Header::Line { value, .. } if value > i64::from(i32::MAX) => self.unjudged(input),
                Header::Line { n, value } => {
                    // `*0` and `*-1` are empty commands the server skips.
                    if value > 0 {
                        self.at = At::Argument { left: value as u64, size: n as u64 };
                        Step::Start(n)
                    } else {
                        Step::Pass(n)
                    }
                }
            },
            At::Argument { left, size } => match header(input, b'$') {
                Header::Incomplete => Step::Wait,
                Header::Bad => self.unjudged(input),
                Header::Line { value, .. } if value < 0 => self.unjudged(input),
                Header::Line { n, value } => {
                    let bytes = value as u64 + 2;
                    let size = size + n as u64 + bytes;
                    self.at = At::Bulk { bytes, left: left - 1, size };
                    if size > self.limit {
                        Step::Over { n, size }
                    } else {
                        Step::Argument { n, bytes }
                    }
                }
            },
        }
    }

    fn after_argument(left: u64, size: u64) -> At {
        if left == 0 {
            At::Between
        } else {
            At::Argument { left, size }
        }
    }

    fn unjudged(&mut self, input: &[u8]) -> Step {
        self.at = At::Unjudged;
        Step::Pass(input.len())
    }
}

/// A header line at the start of some input.
enum Header {
    Incomplete,
    Bad,
    /// `n` bytes long, its line end included, giving `value`.
    Line {
        n: usize,
        value: i64,
    },
}

/// Reads a header as Redis 7 does (`processMultibulkBuffer`): the line ends
/// at its first `\r`, and the byte after that is skipped unread, whatever it
/// is; the number is read as `string2ll` reads it (an optional `-`, digits, no
/// `+`, no leading zero). Where Redis would refuse the header (and close the
/// connection) this says `Bad`; where it would read it, this reads the same.
fn header(input: &[u8], kind: u8) -> Header {
    if input[0] != kind {
        return Header::Bad;
    }
    let Some(end) = input.iter().take(MAX_HEADER).position(|&b| b == b'\r') else {
        return if input.len() < MAX_HEADER { Header::Incomplete } else { Header::Bad };
    };
    if end + 1 >= input.len() {
        return Header::Incomplete;
    }
    match string2ll(&input[1..end]) {
        Some(value) => Header::Line { n: end + 2, value },
        None => Header::Bad,
    }
}

/// A number as Redis's `string2ll` reads one; None where it refuses.
fn string2ll(text: &[u8]) -> Option<i64> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    let leading_zero = digits.len() > 1 && digits[0] == b'0';
    if digits.is_empty() || leading_zero || !digits.iter().all(u8::is_ascii_digit) || text == b"-0" {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `stream` through a framer in pieces of `piece` bytes, as a relay
    /// would; what passed, and the sizes of commands found over the limit
    /// (their bytes dropped from the header on, to the command's end).
    fn run(stream: &[u8], piece: usize, limit: u64) -> (Vec<u8>, Vec<u64>) {
        let mut commands = Commands::new(limit);
        let (mut passed, mut over, mut held) = (Vec::new(), Vec::new(), Vec::new());
        let mut dropping = false;
        for chunk in stream.chunks(piece) {
            held.extend_from_slice(chunk);
            let mut at = 0;
            while at < held.len() {
                match commands.step(&held[at..]) {
                    Step::Wait => break,
                    Step::Pass(n) | Step::Start(n) | Step::Argument { n, .. } => {
                        if !dropping {
                            passed.extend_from_slice(&held[at..at + n]);
                        }
                        at += n;
                    }
                    Step::Over { n, size } => {
                        over.push(size);
                        dropping = true;
                        at += n;
                    }
                }
                if dropping && commands.between() {
                    dropping = false;
                }
            }
            held.drain(..at);
        }
        passed.extend_from_slice(&held);
        (passed, over)
    }

    fn command(args: &[&[u8]]) -> Vec<u8> {
        crate::resp::command(args)
    }

    #[test]
    fn commands_under_the_limit_pass_whole_in_any_pieces() {
        let mut stream = command(&[b"SET", b"k", &[b'v'; 1000]]);
        stream.extend_from_slice(b"PING\r\n");
        stream.extend_from_slice(b"*0\r\n");
        stream.extend_from_slice(&command(&[b"GET", b"k"]));
        for piece in [1, 2, 3, 7, 64, 5000] {
            assert_eq!(run(&stream, piece, 2000), (stream.clone(), vec![]), "in pieces of {piece}");
        }
    }

    #[test]
    fn a_command_over_the_limit_is_dropped_from_its_first_header_over_it() {
        let small = command(&[b"SET", b"a", b"1"]);
        let big = command(&[b"MSET", b"x", &[b'v'; 600], b"y", &[b'v'; 600]]);
        let stream = [small.clone(), big.clone(), small.clone()].concat();
        for piece in [1, 5, 100, 10_000] {
            let (passed, over) = run(&stream, piece, 1000);
            // What precedes the header that goes over is passed; the relay
            // then breaks the command at the server.
            let before = big.len() - (b"$600\r\n".len() + 602);
            assert_eq!(over, vec![big.len() as u64], "in pieces of {piece}");
            assert_eq!(passed, [&small[..], &big[..before], &small[..]].concat(), "in pieces of {piece}");
        }
    }

    #[test]
    fn headers_are_read_as_redis_reads_them() {
        // Redis ends a header at its first CR and skips the next byte unread.
        let odd_end = b"*1\r\n$4\rXPING\r\n";
        let mut big = odd_end.to_vec();
        big.extend_from_slice(&command(&[b"SET", b"k", &[b'v'; 600]]));
        let (passed, over) = run(&big, 1, 100);
        // The odd header is read, so the SET after it is still judged: refused.
        assert_eq!(over, vec![big.len() as u64 - odd_end.len() as u64]);
        assert_eq!(passed, [&odd_end[..], b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n"].concat());
        for (text, read) in [
            (&b"12"[..], Some(12)),
            (b"0", Some(0)),
            (b"-1", Some(-1)),
            (b"+5", None),
            (b"05", None),
            (b"-0", None),
            (b"", None),
            (b"1 ", None),
            (b"99999999999999999999", None),
        ] {
            assert_eq!(string2ll(text), read, "{text:?}");
        }
    }

    #[test]
    fn what_is_not_resp_passes_unjudged() {
        for stream in [
            &b"*x\r\n$3\r\nGET\r\n"[..],
            b"*2\r\n+OK\r\n",
            b"*1\r\n$-1\r\n",
            b"*99999999999999999999999999\r\n",
            b"*3000000000\r\n$1\r\nx\r\n",
            b"*1\n$1\r\nx\r\n",
            b"PI\0NG\n*1\r\n$1\r\nx\r\n",
        ] {
            let (passed, over) = run(stream, 1, 10);
            assert_eq!((passed.as_slice(), over), (stream, vec![]));
        }
    }
}
