package console

// i18n.go: the pages in English or Chinese, by the browser's
// Accept-Language (the first language it names that the console has).
// Reasons, class names and messages from the policy are shown as written.

import (
	"fmt"
	"net/http"
	"strings"
)

// zh holds the Chinese of every English phrase the pages use; a phrase
// missing here shows in English.
var zh = map[string]string{
	"Reviewers today":                "今日审核进度",
	"Reviewer":                       "审核人",
	"Decided today":                  "今日已决定",
	"Open claims":                    "认领中",
	"Overdue claims":                 "认领已超时",
	"Keys":                           "快捷键",
	"next / previous item":           "下一项 / 上一项",
	"open the task":                  "打开任务",
	"claim":                          "认领",
	"approve":                        "批准",
	"reject":                         "驳回",
	"then type the reason and press": "然后输入理由并按",
	"to confirm":                     "确认",
	"an approval: Enter again; a reject shows the end-user message first": "批准需再按一次 Enter；驳回会先显示发给最终用户的消息",
	"sends":               "发送",
	"cancel":              "取消",
	"claimed by you":      "由您认领",
	"held by":             "认领人",
	"assigned by":         "指派人",
	"until":               "至",
	"Release":             "释放",
	"Claim":               "认领",
	"Assign to":           "指派给",
	"Assign":              "指派",
	"Operator console":    "运维控制台",
	"Review queue":        "审核队列",
	"Task timeline":       "任务时间线",
	"Breakers":            "熔断器",
	"Dead letter":         "死信",
	"Alerts":              "告警",
	"Sign in":             "登录",
	"Sign out":            "退出",
	"Sign out everywhere": "全部设备退出",
	"Ends every session you signed in, on every device": "结束您在所有设备上的登录",
	"Name":                                "用户名",
	"Password":                            "密码",
	"Task ID":                             "任务 ID",
	"Search":                              "搜索",
	"Owner":                               "负责人",
	"Class":                               "类别",
	"Reason":                              "原因",
	"Time left":                           "剩余时间",
	"overdue":                             "已超时",
	"Model":                               "模型",
	"Cost":                                "费用",
	"Input":                               "输入",
	"Decide":                              "决定",
	"Approve":                             "批准",
	"Reject":                              "驳回",
	"Filter":                              "筛选",
	"all":                                 "全部",
	"Open":                                "待处理",
	"Overdue":                             "超时",
	"Open items":                          "待处理项",
	"No open items.":                      "没有待处理项。",
	"Recently closed":                     "最近关闭",
	"Outcome":                             "结果",
	"Closed":                              "关闭时间",
	"Bulk decision":                       "批量决定",
	"Preview":                             "预览",
	"Confirm":                             "确认",
	"Cancel":                              "取消",
	"Time":                                "时间",
	"Topic":                               "主题",
	"Step":                                "步骤",
	"Scope":                               "范围",
	"Key":                                 "键",
	"State":                               "状态",
	"Failure rate":                        "失败率",
	"Why it opened":                       "打开原因",
	"Next probe":                          "下次探测",
	"Held retries":                        "暂扣重试",
	"Recent transitions":                  "最近状态变化",
	"Reset":                               "重置",
	"Kind":                                "类型",
	"Message":                             "消息",
	"Task":                                "任务",
	"Since":                               "开始时间",
	"Until":                               "结束时间",
	"Error kind":                          "错误类型",
	"Re-drive":                            "重新投递",
	"Re-drive jobs":                       "重新投递任务",
	"Dry run":                             "试运行",
	"Selected":                            "已选",
	"All matching the filter":             "所有符合筛选的记录",
	"Original bytes":                      "原始字节",
	"Headers":                             "消息头",
	"Pause":                               "暂停",
	"Resume":                              "继续",
	"Stop":                                "停止",
	"Progress":                            "进度",
	"Rate":                                "速率",
	"By":                                  "执行人",
	"Live":                                "实时",
	"Instance":                            "实例",
	"decided by":                          "已由此人决定：",
	"waiting for the router":              "等待路由器确认",
	"deciding it reopens template %s":     "决定此项将重新开放模板 %s",
	"%d more items keep %s offline":       "另有 %d 项使 %s 保持下线",
	"1 more item keeps %s offline":        "另有 1 项使 %s 保持下线",
	"The end user will get this message:": "最终用户将收到以下消息：",
	"Send the rejection":                  "发送驳回",
	"Rebuilding the view from the topics": "正在从主题重建视图",
	"records":                             "条记录",
	"you may view only":                   "您只有查看权限",
	"latched until a person resets it":    "锁定，需人工重置",
	"Loop guard":                          "循环保护",
	"Signed in as":                        "当前用户",
	"Error":                               "错误",
	"new items arrived":                   "有新的待处理项",
	"reload":                              "刷新",
	"Items":                               "项",
	"Per second":                          "每秒",
	"Run":                                 "运行",
	"Job":                                 "任务",
	"Dead letters":                        "死信记录",
	"No dead letters match.":              "没有符合条件的死信。",
	"No breaker has changed state yet.":   "熔断器尚无状态变化。",
	"No alerts yet.":                      "暂无告警。",
	"No records for this task.":           "此任务没有记录。",
	"the first":                           "前",
	"of":                                  "/",
	"First page":                          "第一页",
	"Next page":                           "下一页",
	"Operator log":                        "操作日志",
	"Operator actions":                    "操作记录",
	"Action":                              "操作",
	"What":                                "内容",
	"Tasks":                               "任务",
	"Older":                               "更早",
	"No operator actions yet.":            "暂无操作记录。",
	"Address":                             "地址",
	"unknown name":                        "未知用户名",
	"Exactly these items are decided; items that arrive meanwhile are not.": "只决定以上这些条目；预览之后到达的条目不包含在内。",

	// the Cost and What-if pages
	"Spend":                                  "花费",
	"Failed spend":                           "失败尝试的花费",
	"Succeeded spend":                        "成功尝试的花费",
	"Cost prevented":                         "避免的花费",
	"Range":                                  "范围",
	"or upload it":                           "或上传文件",
	"Show":                                   "显示",
	"attempts":                               "次尝试",
	"failed attempts":                        "次失败尝试",
	"tasks stopped":                          "个任务被及时停止",
	"Spend per hour, by class":               "每小时花费（按类别）",
	"Cost prevented per hour":                "每小时避免的花费",
	"top of the scale":                       "刻度上限",
	"Top models by failed spend":             "失败花费最多的模型",
	"Top prompt templates by failed spend":   "失败花费最多的提示模板",
	"Provider/model":                         "提供方/模型",
	"Prompt template":                        "提示模板",
	"No decided attempts in this range yet.": "此范围内尚无已决策的尝试。",
	"What-if":                                "假设分析",
	"Replay":                                 "回放",
	"Changed decisions":                      "改变的决策",
	"Review load per owner":                  "各负责人的审核量",
	"Cost impact":                            "费用影响",
	"Limits of a what-if":                    "假设分析的局限",
}

// lang picks en or zh from the Accept-Language header.
func lang(r *http.Request) string {
	for _, part := range strings.Split(r.Header.Get("Accept-Language"), ",") {
		tag := strings.ToLower(strings.TrimSpace(strings.SplitN(part, ";", 2)[0]))
		switch {
		case strings.HasPrefix(tag, "zh"):
			return "zh"
		case strings.HasPrefix(tag, "en"):
			return "en"
		}
	}
	return "en"
}

// translator returns the t function of a page in lang: t "phrase" args...
// formats the phrase (fmt verbs) after translating it.
func translator(lang string) func(string, ...any) string {
	return func(s string, args ...any) string {
		if lang == "zh" {
			if z, ok := zh[s]; ok {
				s = z
			}
		}
		if len(args) > 0 {
			return fmt.Sprintf(s, args...)
		}
		return s
	}
}
