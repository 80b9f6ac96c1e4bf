#include "worker/comm/tcp_socket.h"

#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::comm {
namespace {

TEST(HostPortTest, ParsesAndJoins) {
  absl::StatusOr<HostPort> hp = ParseHostPort("127.0.0.1:80");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "127.0.0.1");
  EXPECT_EQ(hp->port, 80);
  hp = ParseHostPort("[::1]:0");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "::1");
  EXPECT_EQ(JoinHostPort("::1", 5), "[::1]:5");
  EXPECT_EQ(JoinHostPort("h", 5), "h:5");
  EXPECT_FALSE(ParseHostPort("nohost").ok());
  EXPECT_FALSE(ParseHostPort("h:70000").ok());
  EXPECT_FALSE(ParseHostPort("h:x").ok());
}

TEST(TcpSocketTest, ConnectAcceptAndTransferBothWays) {
  absl::StatusOr<ScopedFd> listener = ListenTcp("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::StatusOr<int> port = LocalPort(listener->get());
  ASSERT_TRUE(port.ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  absl::StatusOr<ScopedFd> client = ConnectTcp(JoinHostPort("127.0.0.1", *port), deadline);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<ScopedFd> server = AcceptTcp(listener->get(), deadline);
  ASSERT_TRUE(server.ok()) << server.status();

  // More than a socket buffer, so WriteFull must wait for the reader.
  std::string big(8 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  std::thread writer(
      [&] { EXPECT_TRUE(WriteFull(client->get(), big.data(), big.size(), deadline).ok()); });
  std::string got(big.size(), '\0');
  ASSERT_TRUE(ReadFull(server->get(), got.data(), got.size(), deadline).ok());
  writer.join();
  EXPECT_TRUE(got == big);

  client->reset();
  char byte;
  absl::Status eof = ReadFull(server->get(), &byte, 1, deadline);
  EXPECT_TRUE(absl::IsUnavailable(eof)) << eof;
}

TEST(TcpSocketTest, DeadlinesEndEveryWait) {
  absl::StatusOr<ScopedFd> listener = ListenTcp("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  const absl::Time soon = absl::Now() + absl::Milliseconds(100);
  EXPECT_TRUE(absl::IsDeadlineExceeded(AcceptTcp(listener->get(), soon).status()));
  absl::StatusOr<int> port = LocalPort(listener->get());
  absl::StatusOr<ScopedFd> client =
      ConnectTcp(JoinHostPort("127.0.0.1", *port), absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(client.ok());
  char byte;
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      ReadFull(client->get(), &byte, 1, absl::Now() + absl::Milliseconds(100))));
}

TEST(TcpSocketTest, RefusedConnectIsUnavailable) {
  // Bind and close to get a port with (almost certainly) nobody listening.
  int port = 0;
  {
    absl::StatusOr<ScopedFd> listener = ListenTcp("127.0.0.1", 0);
    ASSERT_TRUE(listener.ok());
    port = *LocalPort(listener->get());
  }
  absl::StatusOr<ScopedFd> client =
      ConnectTcp(JoinHostPort("127.0.0.1", port), absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(absl::IsUnavailable(client.status())) << client.status();
}

}  // namespace
}  // namespace deepinfer::comm
