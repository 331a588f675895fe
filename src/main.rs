//! The `tandem` command line: argument parsing and dispatch only; every model lives in the
//! library.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    // Like other Unix tools, end quietly when the reader of our output goes away
    // (`tandem … | head`) instead of failing on a broken pipe.
    // SAFETY: called before any thread starts; restores the default disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
