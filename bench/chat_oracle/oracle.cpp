// The vendored llama.cpp's own chat parser as a command: reads JSON lines {template (a file),
// messages, tools, tool_choice, parallel_tool_calls, reasoning_format, enable_thinking, input}
// and writes JSON lines {format, whole | whole_error, partial | partial_error}: the message
// common_chat_parse gives for `input` as the end of the output (whole) and mid-stream
// (partial), or the error it raises; with {template, caps: true}: {caps} (/props
// chat_template_caps). Built by bench/malformed_calls.py.
#include "chat.h"
#include <nlohmann/json.hpp>
#include <fstream>
#include <iostream>
#include <sstream>
using json = nlohmann::ordered_json;

static json msg_json(const common_chat_msg & m) {
    json calls = json::array();
    for (auto & c : m.tool_calls) calls.push_back({{"name", c.name}, {"arguments", c.arguments}, {"id", c.id}});
    return {{"content", m.content}, {"reasoning_content", m.reasoning_content}, {"tool_calls", calls}};
}

int main() {
    std::string line;
    while (std::getline(std::cin, line)) {
        json out;
        try {
            auto job = json::parse(line);
            std::ifstream f(job.at("template").get<std::string>());
            std::stringstream ss; ss << f.rdbuf();
            auto tmpls = common_chat_templates_init(nullptr, ss.str(), "<s>", "</s>");
            if (job.value("caps", false)) {  // /props chat_template_caps
                json caps = json::object();
                for (auto & [name, value] : common_chat_templates_get_caps(tmpls.get())) caps[name] = value;
                std::cout << json{{"caps", caps}}.dump() << std::endl;
                continue;
            }
            common_chat_templates_inputs inputs;
            inputs.messages = common_chat_msgs_parse_oaicompat(common_json::parse(job.at("messages").dump()));
            if (job.contains("tools") && !job["tools"].empty()) inputs.tools = common_chat_tools_parse_oaicompat(common_json::parse(job["tools"].dump()));
            if (job.contains("tool_choice")) inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(job["tool_choice"].get<std::string>());
            inputs.parallel_tool_calls = job.value("parallel_tool_calls", false);
            inputs.reasoning_format = common_reasoning_format_from_name(job.value("reasoning_format", std::string("none")));
            inputs.enable_thinking = job.value("enable_thinking", true);
            auto params = common_chat_templates_apply(tmpls.get(), inputs);
            common_chat_parser_params pp(params);
            pp.reasoning_format = inputs.reasoning_format;
            pp.parser.load(params.parser);
            out["format"] = common_chat_format_name(params.format);
            auto input = job.at("input").get<std::string>();
            try { out["whole"] = msg_json(common_chat_parse(input, false, pp)); }
            catch (const std::exception & e) { out["whole_error"] = e.what(); }
            try { out["partial"] = msg_json(common_chat_parse(input, true, pp)); }
            catch (const std::exception & e) { out["partial_error"] = e.what(); }
        } catch (const std::exception & e) {
            out["error"] = e.what();
        }
        std::cout << out.dump() << std::endl;
    }
}
