/* Number formatting shared by the JSON and YAML writers. */
#ifndef LLMT_UTIL_FORMAT_H
#define LLMT_UTIL_FORMAT_H

/* Writes finite v as the shortest of %.15g, %.16g, %.17g that reads back as
 * the same double (17 digits always do); returns the length. %g never
 * writes "1." or ".5", so the text is also a JSON and YAML number. */
int llmt_format_double(char text[32], double v);

/* The same for an fp32 value: the shortest of %.6g .. %.9g that reads back
 * (strtof) as the same float. */
int llmt_format_float(char text[32], float v);

#endif
