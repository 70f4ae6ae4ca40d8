"""Tool calling on chat completions: the request's tools and tool_choice (chat.py), streamed calls
(chat_stream.py), and the parsers that find calls in a model's text (parsers/)."""
