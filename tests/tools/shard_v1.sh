# Sourced by the shell tests that train on a hand-made shard.
# write_shard FILE TEXT: a version-1 shard (docs/data.md) of ASCII text,
# each byte a token (little-endian header: magic, version, token count, zero
# padding to 1024 bytes, then the tokens as 16-bit values).
write_shard() {
    le32() { printf "\\$(printf %03o $(($1 & 255)))\\$(printf %03o $(($1 >> 8 & 255)))\\$(printf %03o $(($1 >> 16 & 255)))\\$(printf %03o $(($1 >> 24 & 255)))"; }
    { le32 20240520; le32 1; le32 "${#2}"; head -c 1012 /dev/zero; printf %s "$2" | iconv -f ASCII -t UTF-16LE; } > "$1"
}
# write_text_shard DIR: makes DIR with DIR/t_000000.bin, the tiny runs' shard
# (a sentence of byte tokens, 12 times: 576 tokens).
write_text_shard() {
    local text="" i
    for i in 1 2 3 4 5 6 7 8 9 10 11 12; do text="${text}a bad cab fed a deaf jade bead; mama hid a ham. "; done
    mkdir "$1"
    write_shard "$1/t_000000.bin" "$text"
}
