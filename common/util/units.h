// Parsing of human-written sizes ("4GiB", "256M", "1048576"), and the one parser and the one
// formatter of server addresses ("host:port", "[ipv6]:port").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "rdkv/status.h"

namespace rdkv {

// Accepts a decimal integer with an optional suffix: K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB,
// P/PB/PiB (all binary: 1K = 1024), case-insensitive. kInvalidArgument with the input quoted
// otherwise, and for a size beyond 64 bits.
Result<uint64_t> ParseByteSize(std::string_view text);

// Splits "host:port" or "[ipv6]:port" (port 1..65535; IPv6 hosts come back without the
// brackets). kInvalidArgument quoting the input and saying what is wrong otherwise.
Status ParseHostPort(std::string_view text, std::string* host, uint16_t* port);
// "host:port", the host in brackets when it is an IPv6 address ("[::1]:7400"): what
// ParseHostPort reads back.
std::string FormatHostPort(std::string_view host, uint16_t port);

}  // namespace rdkv
