# readme_block README NAME: prints the fenced block that follows the line
# "<!-- install: NAME -->" in README, as written (the package tests run the
# README's install blocks themselves). Sourced by the package tests.
readme_block() {
  awk -v mark="<!-- install: $2 -->" '
    $0 == mark { found = 1; next }
    found && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }' "$1"
}
