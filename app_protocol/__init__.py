"""The message protocol between the ServerApp and the ClientApp: record keys and paired codecs."""
