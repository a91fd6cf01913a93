# Sourced by the shell tests that train on a hand-made shard.
# write_shard FILE TEXT: a version-1 shard (docs/data.md) of ASCII text,
# each byte a token (little-endian header: magic, version, token count, zero
# padding to 1024 bytes, then the tokens as 16-bit values).
write_shard() {
    le32() { printf "\\$(printf %03o $(($1 & 255)))\\$(printf %03o $(($1 >> 8 & 255)))\\$(printf %03o $(($1 >> 16 & 255)))\\$(printf %03o $(($1 >> 24 & 255)))"; }
    { le32 20240520; le32 1; le32 "${#2}"; head -c 1012 /dev/zero; printf %s "$2" | iconv -f ASCII -t UTF-16LE; } > "$1"
}
