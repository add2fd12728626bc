//! placeholder
mod lab;
fn main() -> std::process::ExitCode {
    lab::main(&[])
}
