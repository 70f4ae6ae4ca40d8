"""What clients send and get back: OpenAI's request bodies (plus vLLM's extras), the fields Tram refuses,
and OpenAI-style error bodies."""
