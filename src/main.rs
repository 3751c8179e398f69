//! `cudaleak`: the command. Everything is in the library (src/lib.rs).

fn main() -> std::process::ExitCode {
    cudaleak_cli::main()
}
