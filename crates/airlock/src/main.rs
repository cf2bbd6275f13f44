//! The `airlock` binary: the daemon and its command-line client.

fn main() {
    airlock::cli::main()
}
