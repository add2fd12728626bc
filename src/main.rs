fn main() {
    eprintln!("prfence: not yet built");
    std::process::exit(1);
}
