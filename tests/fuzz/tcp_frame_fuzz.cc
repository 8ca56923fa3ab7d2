// libFuzzer target: the tcp transport's frame decoders (common/transport/tcp/frame.h), which
// parse every byte a peer sends before authentication and after. None may crash, read out of
// bounds, accept a length beyond its limit, or accept a non-canonical encoding: whatever
// decodes must re-encode to exactly the same bytes.
//
// Input: byte 0 picks the message size limit; the rest is a byte stream, split into frames as
// a connection would, and also given to every body decoder directly.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "common/transport/tcp/frame.h"

namespace {

using namespace rdkv::transport::tcp;
using Bytes = std::span<const uint8_t>;

void Check(bool ok) {
  if (!ok) std::abort();
}

bool Same(const std::vector<uint8_t>& a, Bytes b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

bool Inside(Bytes part, Bytes whole) {
  return part.empty() ||
         (part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size());
}

// Decodes `body` as a frame of `type`; on success re-encodes it and compares with `frame`
// (header + body), or with the body alone when `frame` is empty.
void DecodeAndCompare(FrameType type, Bytes body, Bytes frame) {
  auto compare = [&](const std::vector<uint8_t>& encoded_frame) {
    if (frame.empty()) {
      Check(
          Same(std::vector<uint8_t>(encoded_frame.begin() + kFrameHeaderSize, encoded_frame.end()),
               body));
    } else {
      Check(Same(encoded_frame, frame));
    }
  };
  switch (type) {
    case FrameType::kHello: {
      auto version = PeekHelloVersion(body);
      auto h = DecodeHello(body);
      if (h.ok()) {
        Check(version.ok() && *version == h->version);
        Check(h->auth.role == rdkv::transport::SessionRole::kData ||
              h->auth.role == rdkv::transport::SessionRole::kAdmin);
        Check(body.size() == kHelloBodySize);
        compare(EncodeHello(*h));
      }
      break;
    }
    case FrameType::kChallenge: {
      auto c = DecodeChallenge(body);
      if (c.ok()) compare(EncodeChallenge(*c));
      break;
    }
    case FrameType::kProof: {
      auto p = DecodeProof(body);
      if (p.ok()) compare(EncodeProof(*p));
      break;
    }
    case FrameType::kWelcome: {
      auto w = DecodeWelcome(body);
      if (w.ok()) {
        Check(w->regions.size() <= kMaxRegions);
        compare(EncodeWelcome(*w));
      }
      break;
    }
    case FrameType::kRefused: {
      auto r = DecodeRefused(body);
      if (r.ok()) compare(EncodeRefused(*r));
      break;
    }
    case FrameType::kCallError: {
      auto e = DecodeCallError(body);
      if (e.ok()) {
        Check(e->code != rdkv::StatusCode::kOk && e->reason.size() <= kMaxReasonLength);
        compare(EncodeCallError(*e));
      }
      break;
    }
    case FrameType::kReadRequest: {
      auto r = DecodeReadRequest(body);
      if (r.ok()) {
        std::vector<uint8_t> f(kReadRequestFrameSize);
        EncodeReadRequest(*r, std::span<uint8_t, kReadRequestFrameSize>(f.data(), f.size()));
        compare(f);
      }
      break;
    }
    case FrameType::kReadResponse: {
      auto r = DecodeReadResponse(body);
      if (r.ok()) {
        Check(Inside(r->data, body));
        std::vector<uint8_t> f(kReadResponseHeadSize);
        EncodeReadResponseHead(r->wr_id, r->status, static_cast<uint32_t>(r->data.size()),
                               std::span<uint8_t, kReadResponseHeadSize>(f.data(), f.size()));
        f.insert(f.end(), r->data.begin(), r->data.end());
        compare(f);
      }
      break;
    }
    case FrameType::kCallRequest:
    case FrameType::kCallResponse: {
      auto c = DecodeCall(body);
      if (c.ok()) {
        Check(Inside(c->payload, body));
        std::vector<uint8_t> f(kCallHeadSize);
        EncodeCallHead(type, c->request_id, static_cast<uint32_t>(c->payload.size()),
                       std::span<uint8_t, kCallHeadSize>(f.data(), f.size()));
        f.insert(f.end(), c->payload.begin(), c->payload.end());
        compare(f);
      }
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t max_message = 1 + size_t{data[0]} * 97;  // small limits, so they are reached
  Bytes in(data + 1, size - 1);

  // As a connection reads it: frame after frame until an error or an incomplete frame.
  Bytes rest = in;
  for (;;) {
    auto f = NextFrame(rest, max_message);
    if (!f.ok()) break;
    if (!f->have_header) {
      Check(rest.size() < kFrameHeaderSize);
      break;
    }
    Check(f->header.body_length <= MaxBodyLength(f->header.type, max_message));
    Check(f->frame_size == kFrameHeaderSize + f->header.body_length);
    if (!f->complete) {
      Check(rest.size() < f->frame_size);
      break;
    }
    Check(f->body.size() == f->header.body_length && Inside(f->body, rest));
    DecodeAndCompare(f->header.type, f->body, rest.first(f->frame_size));
    rest = rest.subspan(f->frame_size);
  }

  // Every body decoder on the raw bytes.
  for (uint8_t t = 1; t <= 7; ++t) DecodeAndCompare(static_cast<FrameType>(t), in, {});
  return 0;
}
